"""FlashInfer fused ops vs the torch references, on fresh random bf16 data, outputs poisoned
first so an unwritten element fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minisgl_worker.attention.store import rope_store_kv, store_kv
from minisgl_worker.layers import cuda_ops
from minisgl_worker.layers.rotary import RopeScaling, RotaryEmbedding

from .paged import rel_err

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2


# ---- torch references (the math of the torch-native layers) ----

def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (rmsnorm(x + residual), x + residual), out of place."""
    s = x + residual
    return rmsnorm_ref(s, weight, eps), s


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_ref(
    positions: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x (T, H, D) rotated out of place; cos/sin (P, D/2) as `RotaryEmbedding` holds them."""
    c = cos[positions].unsqueeze(1)  # (T, 1, D/2)
    s = sin[positions].unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=BF16)


@pytest.mark.parametrize("tokens", [1, 7, 333])
@pytest.mark.parametrize("hidden", [576, 1024, 4096])
def test_rmsnorm(tokens: int, hidden: int) -> None:
    x, w = _rand(tokens, hidden) * 3, _rand(hidden)
    out = torch.full_like(x, float("nan"))
    cuda_ops.rmsnorm(x, w, 1e-6, out=out)
    assert rel_err(out, rmsnorm_ref(x, w, 1e-6)) < TOL


@pytest.mark.parametrize("heads,head_dim", [(16, 128), (8, 128), (3, 64)])
def test_qk_rmsnorm_on_strided_heads(heads: int, head_dim: int) -> None:
    """Qwen3's per-head q/k norm runs on a view into the fused qkv output."""
    qkv = _rand(50, (heads + 4) * head_dim)
    x = qkv[:, : heads * head_dim].view(50, heads, head_dim)
    w = _rand(head_dim)
    out = torch.full_like(x, float("nan"))
    cuda_ops.rmsnorm(x, w, 1e-6, out=out)
    assert rel_err(out, rmsnorm_ref(x, w, 1e-6)) < TOL


@pytest.mark.parametrize("tokens,hidden", [(1, 576), (64, 1024), (300, 4096)])
def test_fused_add_rmsnorm_in_place(tokens: int, hidden: int) -> None:
    x, res, w = _rand(tokens, hidden), _rand(tokens, hidden), _rand(hidden)
    ref_out, ref_sum = fused_add_rmsnorm_ref(x, res, w, 1e-5)
    cuda_ops.fused_add_rmsnorm(x, res, w, 1e-5)
    assert rel_err(res, ref_sum) < TOL
    assert rel_err(x, ref_out) < TOL


@pytest.mark.parametrize("tokens,inter", [(1, 1536), (77, 3072), (256, 14336)])
def test_silu_and_mul(tokens: int, inter: int) -> None:
    x = _rand(tokens, 2 * inter)
    out = torch.full((tokens, inter), float("nan"), device=DEV, dtype=BF16)
    cuda_ops.silu_and_mul(x, out=out)
    assert rel_err(out, silu_and_mul_ref(x)) < TOL


ROPE_SHAPES = [
    (16, 8, 128, 1e6, RopeScaling()),  # Qwen3-0.6B
    (32, 8, 128, 5e5, RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)),  # Llama-3.1-8B
    (9, 3, 64, 1e5, RopeScaling()),  # SmolLM2-135M
]


@pytest.mark.parametrize("hq,hkv,d,theta,scaling", ROPE_SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
def test_rope_store_kv_matches_rope_then_store(
    hq: int, hkv: int, d: int, theta: float, scaling: RopeScaling, page_size: int,
    qk_norm: bool, pos_dtype: torch.dtype,
) -> None:
    """The fused kernel: q rotated in place, k rotated into its slot, v copied, equal to
    the torch RoPE layer followed by `store_kv`, no other slot written; with qk_norm (Qwen3)
    each head of q and k RMS-normalized first, as FlashInfer's RMSNorm does."""
    rope = RotaryEmbedding(d, 32768, theta, scaling).to(DEV)
    cache = torch.cat((rope.cos, rope.sin), dim=-1).contiguous()
    tokens, slots = 211, 4096
    qkv = _rand(tokens, (hq + 2 * hkv) * d)
    ref_qkv = qkv.clone()
    pos = torch.randint(0, 32768, (tokens,), device=DEV, dtype=pos_dtype)
    loc = torch.randperm(slots, device=DEV)[:tokens]

    def views(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = t.split([hq * d, hkv * d, hkv * d], dim=-1)
        return q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)

    caches = [torch.zeros(slots // page_size, page_size, hkv, d, device=DEV, dtype=BF16)
              for _ in range(4)]
    q_w, k_w = _rand(d) + 1, _rand(d) + 1
    q, k, v = views(qkv)
    rope_store_kv(caches[0], caches[1], loc, pos, cache, q, k, v,
                  (q_w, k_w, 1e-6) if qk_norm else None)
    ref_q, ref_k, ref_v = views(ref_qkv)
    if qk_norm:
        ref_q, ref_k = cuda_ops.rmsnorm(ref_q, q_w, 1e-6), cuda_ops.rmsnorm(ref_k, k_w, 1e-6)
    layer_q, layer_k = rope(pos.long(), ref_q, ref_k)
    ref_q = rope_ref(pos, ref_q, rope.cos, rope.sin)
    ref_k = rope_ref(pos, ref_k, rope.cos, rope.sin)
    assert torch.equal(layer_q, ref_q) and torch.equal(layer_k, ref_k)  # the layer's math
    store_kv(caches[2], caches[3], loc, ref_k, ref_v)
    assert rel_err(q, ref_q) < TOL
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert rel_err(got.view(-1, hkv, d)[loc], want.view(-1, hkv, d)[loc]) < TOL
    assert torch.equal(caches[1], caches[3])  # v is copied bit for bit
    untouched = torch.ones(slots, dtype=torch.bool, device=DEV)
    untouched[loc] = False
    assert not caches[0].view(slots, -1)[untouched].any()
    assert not caches[1].view(slots, -1)[untouched].any()


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_kv_into_a_separate_q_buffer(qk_norm: bool) -> None:
    """q_out (the piecewise graphs' static q): it gets what the in-place call leaves in q,
    q itself is not written, and the caches are the same."""
    hq, hkv, d, tokens = 16, 8, 128, 77
    rope = RotaryEmbedding(d, 4096, 1e6, RopeScaling()).to(DEV)
    cache = torch.cat((rope.cos, rope.sin), dim=-1).contiguous()
    qkv = _rand(tokens, (hq + 2 * hkv) * d)
    pos = torch.randint(0, 4096, (tokens,), device=DEV)
    loc = torch.randperm(1024, device=DEV)[:tokens]
    norm = (_rand(d) + 1, _rand(d) + 1, 1e-6) if qk_norm else None
    runs = []
    for separate in (False, True):
        t = qkv.clone()
        q, k, v = t.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)
        out = torch.full((tokens + 5, hq, d), float("nan"), device=DEV, dtype=BF16)[:tokens]
        caches = [torch.zeros(64, 16, hkv, d, device=DEV, dtype=BF16) for _ in range(2)]
        rope_store_kv(*caches, loc, pos, cache, q, k, v, norm, q_out=out if separate else None)
        runs.append((out if separate else q, caches, t))
    (q_in_place, caches_a, _), (q_out, caches_b, untouched) = runs
    assert torch.equal(q_out, q_in_place)
    assert torch.equal(untouched, qkv)  # the separate call left the qkv rows as they were
    assert all(torch.equal(a, b) for a, b in zip(caches_a, caches_b))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [8, 3])
def test_store_kv_from_a_fused_qkv_view(page_size: int, heads: int) -> None:
    k_cache = torch.zeros(4096 // page_size, page_size, heads, 128, device=DEV, dtype=BF16)
    v_cache = torch.zeros_like(k_cache)
    loc = torch.randperm(4096, device=DEV)[:100]
    qkv = _rand(100, (16 + 2 * heads) * 128)  # k and v: strided views, as the models pass
    k = qkv[:, 16 * 128 : (16 + heads) * 128].view(100, heads, 128)
    v = qkv[:, (16 + heads) * 128 :].view(100, heads, 128)
    store_kv(k_cache, v_cache, loc, k, v)
    assert torch.equal(k_cache.view(-1, heads, 128)[loc], k)
    assert torch.equal(v_cache.view(-1, heads, 128)[loc], v)
    untouched = torch.ones(4096, dtype=torch.bool, device=DEV)
    untouched[loc] = False
    assert not k_cache.view(-1, heads * 128)[untouched].any()
    assert not v_cache.view(-1, heads * 128)[untouched].any()
