"""The CUDA path's KV store kernels (attention/store.py) writing an FP8 pool, on CPU through
Triton's interpreter (in a subprocess: TRITON_INTERPRET must be set before the kernels are
defined): `store_kv` stores what kvcache/quant.py's `to_cache` stores (the value divided by
the layer's scale, saturated to +-448, never NaN), the fused RoPE + store kernel stores the
rotated k and v the same way, and no other slot is written. float16, as the interpreter
mishandles bf16. The interpreter's float32 -> e4m3 cast also drops the carry when rounding
up crosses a power of two (124.4 -> 64, not 128), so the stored values here need no
rounding (e4m3 values times power-of-two scales) except the rotated k's, checked loosely;
the GPU checks the hardware's rounding against `to_cache` (tests/gpu/test_fp8_kv.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")  # a dependency of Linux x86-64 torch wheels

ROOT = Path(__file__).parents[3]
F16 = torch.float16
SCALES = (2.0**-4, 0.25)  # K's and V's: powers of two, so value / scale is exact


def _views(tokens: int, hq: int, hkv: int, d: int) -> tuple[torch.Tensor, ...]:
    """q, k, v as the models pass them: strided views of one fused qkv output; k and v hold
    e4m3 values times their scale (exact in float16) and a few values far past e4m3's range
    at these scales (448 x 2^-4 = 28)."""
    from minisgl_worker.kvcache.quant import FP8, FP8_MAX

    def e4m3_times(scale: float, n: int) -> torch.Tensor:
        x = (torch.randn(tokens, n) * 64).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return x.to(F16) * scale

    qkv = torch.cat([torch.randn(tokens, hq * d, dtype=F16), e4m3_times(SCALES[0], hkv * d),
                     e4m3_times(SCALES[1], hkv * d)], dim=-1)
    qkv[::7, hq * d] = 3e4
    qkv[::5, -1] = -3e4
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)


def _check_slots(cache: torch.Tensor, loc: torch.Tensor, want: torch.Tensor | None) -> None:
    """The FP8 cache's slots `loc` hold `want` (FP8) bit for bit (None: not checked here),
    every other slot is still zero, and nothing is NaN or past e4m3's range."""
    from minisgl_worker.kvcache.quant import FP8_MAX

    slots = cache.view(-1, *cache.shape[2:])
    assert not slots.float().isnan().any() and slots.float().abs().max() <= FP8_MAX
    if want is not None:
        assert torch.equal(slots[loc].float(), want.float())
    untouched = torch.ones(slots.shape[0], dtype=torch.bool)
    untouched[loc] = False
    assert not slots[untouched].float().any()


def check() -> None:
    from minisgl_worker.attention.store import rope_store_kv, store_kv
    from minisgl_worker.kvcache.quant import FP8, FP8_MAX, from_cache, to_cache
    from minisgl_worker.layers.rotary import RopeScaling, RotaryEmbedding

    torch.manual_seed(0)
    for hq, hkv, d, page in ((32, 8, 128, 16), (9, 3, 64, 1)):  # Llama-3.1-8B's, SmolLM2's
        tokens, num_pages = 37, 64
        loc = torch.randperm(num_pages * page)[:tokens]
        q, k, v = _views(tokens, hq, hkv, d)
        k_cache = torch.zeros(num_pages, page, hkv, d, dtype=FP8)
        v_cache = torch.zeros_like(k_cache)
        store_kv(k_cache, v_cache, loc, k, v, SCALES)
        _check_slots(k_cache, loc, to_cache(k, FP8, SCALES[0]))
        _check_slots(v_cache, loc, to_cache(v, FP8, SCALES[1]))
        assert k_cache.view(-1, hkv, d)[loc].float().abs().max() == FP8_MAX  # saturated

        rope = RotaryEmbedding(d, 4096, 1e4, RopeScaling(), fused=True)
        assert rope.cos_sin is not None
        pos = torch.randint(0, 4096, (tokens,))
        ref_q, ref_k = rope(pos, q.clone(), k.clone())
        k_cache.zero_(), v_cache.zero_()
        rope_store_kv(k_cache, v_cache, loc, pos, rope.cos_sin, q, k, v, scales=SCALES)
        assert float((q.float() - ref_q.float()).abs().max()) < 0.05  # q: rotated in place
        # the rotated k needs rounding, which the interpreter gets wrong at powers of two
        _check_slots(k_cache, loc, None)
        got_k = from_cache(k_cache.view(-1, hkv, d)[loc], torch.float32, SCALES[0])
        want_k = from_cache(to_cache(ref_k, FP8, SCALES[0]), torch.float32, SCALES[0])
        err = float((got_k - want_k).norm() / want_k.norm())
        assert err < 0.1, err
        _check_slots(v_cache, loc, to_cache(v, FP8, SCALES[1]))
        print(f"heads {hq}/{hkv} d {d} page {page}: FP8 store ok")


def test_fp8_store_kernels_match_to_cache_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.worker.attention.test_store_fp8"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("FP8 store ok") == 2, done.stdout


if __name__ == "__main__":
    check()
