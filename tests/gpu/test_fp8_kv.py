"""The FP8 (e4m3) KV cache's kernels on the GPU: the store kernels (plain and fused RoPE)
write what kvcache/quant.py's `to_cache` writes, and FlashInfer's prefill, decode and mixed
kernels, its CUDA-graph decode and our whole-KV Triton decode read it with the layer's
scales as a float32 reference reads the dequantized cache (`from_cache`), within the bf16
tolerance of the model-dtype tests (1e-2 relative); the engine-facing FlashInferBackend
agrees with TorchNativeBackend over one FP8 pool. Each case also prints the error against
the unquantized cache: what e4m3 itself costs (not asserted here; tests/gpu/test_fp8_engine.py
measures it on greedy tokens)."""

from __future__ import annotations

import pytest
import torch
from minisgl_worker.attention.flashinfer_backend import FlashInferBackend
from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
from minisgl_worker.attention.flashinfer_meta import PagedKVMeta
from minisgl_worker.attention.store import rope_store_kv, store_kv
from minisgl_worker.attention.torch_native import TorchNativeBackend
from minisgl_worker.context import Context, clear_global_ctx, set_global_ctx
from minisgl_worker.core import Attn, Route, RouteKind
from minisgl_worker.kvcache import MHAKVPool
from minisgl_worker.kvcache.quant import FP8, FP8_MAX, from_cache, to_cache
from minisgl_worker.layers.rotary import RopeScaling, RotaryEmbedding

from .paged import LAYOUTS, PagedBatch, eager_attn, plan, random_batch, reference_attention, rel_err
from .test_flashinfer_backend import _engine_batch

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2
# K's and V's scales for N(0, 1) values: amax ~5 sits at ~1/2 of e4m3's range (the
# calibration's headroom, engine/kv_scales.py); the 40s planted below saturate.
SCALES = (0.022, 0.025)


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=BF16)


def _fp8_caches(num_pages: int, page_size: int, hkv: int, d: int) -> tuple[torch.Tensor, ...]:
    """FP8 caches of random values (a few saturating) -> (k, v) FP8 and their unquantized
    bf16 originals."""
    k, v = _rand(num_pages, page_size, hkv, d), _rand(num_pages, page_size, hkv, d)
    k.view(-1)[::997] = 40.0
    return to_cache(k, FP8, SCALES[0]), to_cache(v, FP8, SCALES[1]), k, v


def _check_quantized(cache: torch.Tensor, loc: torch.Tensor, want: torch.Tensor,
                     exact_share: float) -> None:
    """Slots `loc` of an FP8 cache hold `want` (FP8): bit for bit on `exact_share` of the
    values (the kernels divide in float32 as torch does, up to its last-bit rounding), and
    within one e4m3 step on all; no NaN; every other slot still zero."""
    slots = cache.view(-1, *cache.shape[2:])
    got, ref = slots[loc].float(), want.float()
    assert not slots.float().isnan().any() and slots.float().abs().max() <= FP8_MAX
    share = float((got == ref).float().mean())
    assert share >= exact_share, share
    assert ((got - ref).abs() <= ref.abs() / 8 + 2**-9).all()
    untouched = torch.ones(slots.shape[0], dtype=torch.bool, device=DEV)
    untouched[loc] = False
    assert not slots[untouched].float().any()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_store_kernels_quantize_like_to_cache(layout: str, page_size: int) -> None:
    hq, hkv, d = LAYOUTS[layout]
    tokens, slots = 211, 4096
    loc = torch.randperm(slots, device=DEV)[:tokens]
    qkv = _rand(tokens, (hq + 2 * hkv) * d)
    qkv[::7, hq * d] = 1e3  # past the range: saturates
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)

    def caches(dtype: torch.dtype) -> list[torch.Tensor]:
        return [torch.zeros(slots // page_size, page_size, hkv, d, device=DEV, dtype=dtype)
                for _ in range(2)]

    kc, vc = caches(FP8)
    store_kv(kc, vc, loc, k, v, SCALES)
    _check_quantized(kc, loc, to_cache(k, FP8, SCALES[0]), 0.999)
    _check_quantized(vc, loc, to_cache(v, FP8, SCALES[1]), 0.999)
    assert kc.view(-1, hkv, d)[loc[::7], 0, 0].float().eq(FP8_MAX).all()
    back = from_cache(kc.view(-1, hkv, d)[loc], torch.float32, SCALES[0])
    inside = k.float().abs() < FP8_MAX * SCALES[0]
    assert rel_err(back[inside], k.float()[inside]) < 2**-4  # e4m3: 3 mantissa bits

    # The fused RoPE + store against RoPE into model-dtype caches, then `to_cache` (which
    # rounds k to bf16 first: one e4m3 step apart now and then)
    rope = RotaryEmbedding(d, 32768, 1e6, RopeScaling(), fused=True).to(DEV)
    rope.cos_sin = torch.cat((rope.cos, rope.sin), dim=-1).contiguous()
    pos = torch.randint(0, 32768, (tokens,), device=DEV)
    norm = (_rand(d) + 1, _rand(d) + 1, 1e-6) if layout == "qwen3-0.6b" else None
    q_ref = q.clone()
    kb, vb = caches(BF16)
    rope_store_kv(kb, vb, loc, pos, rope.cos_sin, q_ref, k, v, norm)
    kc, vc = caches(FP8)
    rope_store_kv(kc, vc, loc, pos, rope.cos_sin, q, k, v, norm, scales=SCALES)
    assert rel_err(q, q_ref) < 1e-3  # q is rotated as without quantization
    _check_quantized(kc, loc, to_cache(kb.view(-1, hkv, d)[loc], FP8, SCALES[0]), 0.9)
    _check_quantized(vc, loc, to_cache(v, FP8, SCALES[1]), 0.999)


def _check_against_references(label: str, out: torch.Tensor, q: torch.Tensor,
                              caches: tuple[torch.Tensor, ...], meta: PagedKVMeta,
                              page_size: int) -> None:
    """out against the reference over the dequantized FP8 caches (asserted) and over the
    unquantized ones (printed)."""
    kc, vc, k, v = caches
    deq = reference_attention(q, from_cache(kc, torch.float32, SCALES[0]),
                              from_cache(vc, torch.float32, SCALES[1]), meta, page_size)
    err = rel_err(out, deq)
    lossless = rel_err(out, reference_attention(q, k, v, meta, page_size))
    print(f"{label}: relative error {err:.1e} (against the unquantized cache {lossless:.1e})")
    assert err < TOL, err


CASES = {  # (q_lens, cached prefix lens): the eager kernels `eager_attn` picks
    "prefill": ([1, 17, 64, 200, 5, 128], [33, 0, 100, 7, 256, 1000]),
    "decode": ([1] * 24, [0, 14, 15, 16, 254, 255, 256, 999, 2999] + list(range(50, 1500, 100))),
    "mixed-one-launch": ([1] * 5 + [17, 1, 64, 300], [700, 3, 1000, 16, 255, 0, 40, 100, 33]),
    "mixed-split": ([1] * 5 + [17, 1, 64, 1200], [700, 3, 1000, 16, 255, 0, 40, 100, 33]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_eager_kernels_read_fp8(layout: str, page_size: int, case: str) -> None:
    hq, hkv, d = LAYOUTS[layout]
    q_lens, prefix = CASES[case]
    num_pages = sum(-(-(p + n) // page_size) for p, n in zip(prefix, q_lens)) + 8
    caches = _fp8_caches(num_pages, page_size, hkv, d)
    batch = random_batch(q_lens, prefix, page_size, num_pages, DEV)
    attn = FlashInferPagedAttention(hq, hkv, d, page_size, BF16, DEV, kv_dtype=FP8)
    assert attn.prefill_backend == "fa2"  # FA3 reads FP8 KV only with an FP8 query
    plan(attn, batch.meta)
    q = _rand(sum(q_lens), hq, d)
    out = torch.full_like(q, float("nan"))
    attn.run(q, caches[0], caches[1], out=out, scales=SCALES)
    label = f"{layout} page {page_size} {case} ({eager_attn(attn, q_lens).name})"
    _check_against_references(label, out, q, caches, batch.meta, page_size)


@pytest.mark.parametrize("split_kv", [True, False], ids=["split-kv", "whole-kv"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_decode_graph_replay_reads_fp8(layout: str, split_kv: bool) -> None:
    """Captured with short lengths, replayed with longer ones: FlashInfer's split-KV graph
    wrapper, or the whole-KV Triton kernel."""
    hq, hkv, d = LAYOUTS[layout]
    bs, page_size, max_len = 40, 16, 2048
    num_pages = bs * (max_len // page_size) + 8
    caches = _fp8_caches(num_pages, page_size, hkv, d)
    attn = FlashInferPagedAttention(hq, hkv, d, page_size, BF16, DEV, kv_dtype=FP8)
    attn.init_cuda_graphs([8, bs], max_num_pages=num_pages,
                          whole_kv_sizes=[] if split_kv else [bs])

    def plan_random(longest: int) -> PagedBatch:
        lens = torch.randint(1, longest + 1, (bs,)).tolist()
        batch = random_batch([1] * bs, [n - 1 for n in lens], page_size, num_pages, DEV)
        attn.plan_cuda_graph(batch.meta.kv_indptr, batch.meta.kv_indices,
                             batch.meta.kv_last_page_len, split_kv)
        return batch

    plan_random(64)
    q_static = _rand(bs, hq, d)
    attn.run(q_static, caches[0], caches[1], scales=SCALES)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = attn.run(q_static, caches[0], caches[1], scales=SCALES)
    for longest in (max_len, 300):
        batch = plan_random(longest)
        q_static.copy_(_rand(bs, hq, d))
        out_static.fill_(float("nan"))
        graph.replay()
        label = f"{layout} decode graph {'split-KV' if split_kv else 'whole-KV'} to {longest}"
        _check_against_references(label, out_static.clone(), q_static, caches, batch.meta,
                                  page_size)


@pytest.mark.parametrize("extend", [[1, 1, 1, 1], [1, 40, 1, 300]], ids=["decode", "mixed"])
@pytest.mark.parametrize("layout", ["qwen3-0.6b", "smollm2-135m"])
def test_backend_matches_torch_native_over_an_fp8_pool(layout: str, extend: list[int]) -> None:
    """Both backends store the new k/v through the same kernel, then attend: FlashInfer
    reads the FP8 pool in its kernels, torch-native upcasts it (quant.py)."""
    hq, hkv, d = LAYOUTS[layout]
    scales = ([0.5, SCALES[0]], [0.5, SCALES[1]])  # layer 1's are the ones read
    pool = MHAKVPool(2, 512, 16, hkv, d, FP8, DEV, scales)
    pool.k[1].copy_(to_cache(_rand(*pool.k.shape[1:]), FP8, SCALES[0]))
    pool.v[1].copy_(to_cache(_rand(*pool.v.shape[1:]), FP8, SCALES[1]))
    page_table = torch.zeros((8, 4096), dtype=torch.int32, device=DEV)
    batch = _engine_batch(pool, page_table, [700, 0, 33, 1000], extend)
    tokens = sum(extend)
    q, k, v = _rand(tokens, hq, d), _rand(tokens, hkv, d), _rand(tokens, hkv, d)
    fi = FlashInferBackend(pool, page_table, d**-0.5, hq, dtype=BF16)
    outs = []
    for backend, attn in ((fi, eager_attn(fi.attn, extend)),
                          (TorchNativeBackend(pool, page_table, d**-0.5), Attn.TORCH)):
        ctx = Context(backend)
        set_global_ctx(ctx)
        try:
            backend.prepare(batch, Route(RouteKind.EAGER, attn))
            with ctx.forward_batch(batch):
                outs.append(backend.forward(q, k, v, layer_id=1))
        finally:
            clear_global_ctx()
    err = rel_err(outs[0], outs[1])
    print(f"{layout} {extend}: FlashInfer vs torch-native over FP8 KV, relative error {err:.1e}")
    assert err < TOL, err
