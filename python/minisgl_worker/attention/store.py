"""Writing a layer's new k and v into the paged pool on CUDA: one Triton program per token
copies its k row and its v row to its slot, one launch per layer. The torch way (two
indexed copies) is two launches of ~3.4 us each, 28-32 layers per decode step.

An FP8 pool (`scales` given: the layer's K and V scales) gets each value divided by its
scale and saturated to e4m3's range before the cast, as kvcache/quant.py's `to_cache` does
on CPU (a bare cast would turn out-of-range values into NaN); the rotated k is quantized
straight from float32, without a round trip through the model's dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvcache.quant import FP8_MAX
from ..pdl import launches_pdl

_FP8_MAX = tl.constexpr(FP8_MAX)
Scales = tuple[float, float] | None  # an FP8 pool's (K scale, V scale) of the layer


@triton.jit
def _to_cache(x, scale, dst_ptr, QUANT: tl.constexpr):
    """Values x -> the cache's element type at dst_ptr: divided by `scale` and saturated to
    e4m3's range first when QUANT."""
    if QUANT:
        x = tl.clamp(x.to(tl.float32) / scale, -_FP8_MAX, _FP8_MAX)
    return x.to(dst_ptr.dtype.element_ty)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_stride, v_stride, k_cache_ptr, v_cache_ptr, loc_ptr,
                     k_scale, v_scale, ROW: tl.constexpr, BLOCK: tl.constexpr,
                     QUANT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    for start in tl.static_range(0, ROW, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < ROW
        k = tl.load(k_ptr + t * k_stride + cols, mask=mask)
        v = tl.load(v_ptr + t * v_stride + cols, mask=mask)
        tl.store(k_cache_ptr + slot * ROW + cols,
                 _to_cache(k, k_scale, k_cache_ptr, QUANT), mask=mask)
        tl.store(v_cache_ptr + slot * ROW + cols,
                 _to_cache(v, v_scale, v_cache_ptr, QUANT), mask=mask)


def _check_quant(k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype,
                 scales: Scales) -> tuple[float, float]:
    """The caches hold `dtype` (no scales) or FP8 (scales given) -> the scales to pass."""
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    assert v_cache.dtype == k_cache.dtype and (fp8 or k_cache.dtype == dtype), (
        k_cache.dtype, dtype)
    assert fp8 == (scales is not None), f"FP8 caches take scales; got {scales}"
    return scales or (1.0, 1.0)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, scales: Scales = None) -> None:
    """k, v (T, Hkv, D), each token's heads contiguous (views of a fused qkv output are
    fine) -> one layer's caches (pages, page_size, Hkv, D) at slots `loc` (T,), quantized
    with `scales` when the caches are FP8. CUDA-graph safe."""
    tokens, heads, dim = k.shape
    row = heads * dim
    assert v.shape == k.shape and k_cache.shape[2:] == (heads, dim) and k_cache.is_contiguous()
    assert v_cache.is_contiguous() and k.stride()[1:] == v.stride()[1:] == (dim, 1)
    k_scale, v_scale = _check_quant(k_cache, v_cache, k.dtype, scales)
    if tokens:
        block = min(triton.next_power_of_2(row), 4096)
        _store_kv_kernel[(tokens,)](k, v, k.stride(0), v.stride(0), k_cache, v_cache, loc,
                                    k_scale, v_scale, ROW=row, BLOCK=block,
                                    QUANT=scales is not None, num_warps=4)


@triton.jit
def _norm_rope(x_lo, w_ptr, cos, sin, eps, mask, D: tl.constexpr, NORM: tl.constexpr):
    """Rows of heads at x_lo (first halves; second halves at + D/2) -> the two rotated
    halves in float32, each head RMS-normalized by weight w first when NORM."""
    half = tl.arange(0, D // 2)[None, :]
    x1 = tl.load(x_lo, mask=mask).to(tl.float32)
    x2 = tl.load(x_lo + D // 2, mask=mask).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
        x1 = x1 * rstd * tl.load(w_ptr + half).to(tl.float32)
        x2 = x2 * rstd * tl.load(w_ptr + D // 2 + half).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _rope_store_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, q_stride, k_stride, v_stride,
                       q_out_stride, pos_ptr, cos_sin_ptr,
                       k_cache_ptr, v_cache_ptr, loc_ptr, q_norm_ptr, k_norm_ptr, eps,
                       k_scale, v_scale, HQ: tl.constexpr, HKV: tl.constexpr,
                       HQ_P2: tl.constexpr, HKV_P2: tl.constexpr, D: tl.constexpr,
                       NORM: tl.constexpr, QUANT: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    half = tl.arange(0, D // 2)
    cos = tl.load(cos_sin_ptr + pos * D + half)[None, :]
    sin = tl.load(cos_sin_ptr + pos * D + D // 2 + half)[None, :]
    if PDL:  # the slots, positions and cos/sin were ready before the qkv projection ran
        tl.extra.cuda.gdc_wait()  # for q, k and v: the projection's output
        tl.extra.cuda.gdc_launch_dependents()  # attention may start launching
    # q: rotated into q_out (q itself, or a separate buffer; neox layout: the halves of a
    # head pair up)
    hq = tl.arange(0, HQ_P2)[:, None]
    q_lo = q_ptr + t * q_stride + hq * D + half[None, :]
    q1, q2 = _norm_rope(q_lo, q_norm_ptr, cos, sin, eps, hq < HQ, D, NORM)
    dst_q = q_out_ptr + t * q_out_stride + hq * D + half[None, :]
    tl.store(dst_q, q1.to(q_out_ptr.dtype.element_ty), mask=hq < HQ)
    tl.store(dst_q + D // 2, q2.to(q_out_ptr.dtype.element_ty), mask=hq < HQ)
    # k: rotated into the cache slot; v: copied (both quantized when QUANT)
    hk = tl.arange(0, HKV_P2)[:, None]
    k_lo = k_ptr + t * k_stride + hk * D + half[None, :]
    k1, k2 = _norm_rope(k_lo, k_norm_ptr, cos, sin, eps, hk < HKV, D, NORM)
    dst = k_cache_ptr + slot * HKV * D + hk * D + half[None, :]
    tl.store(dst, _to_cache(k1, k_scale, k_cache_ptr, QUANT), mask=hk < HKV)
    tl.store(dst + D // 2, _to_cache(k2, k_scale, k_cache_ptr, QUANT), mask=hk < HKV)
    cols = hk * D + tl.arange(0, D)[None, :]
    v = tl.load(v_ptr + t * v_stride + cols, mask=hk < HKV)
    tl.store(v_cache_ptr + slot * HKV * D + cols, _to_cache(v, v_scale, v_cache_ptr, QUANT),
             mask=hk < HKV)


def rope_store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
                  positions: torch.Tensor, cos_sin: torch.Tensor, q: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor,
                  qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                  q_out: torch.Tensor | None = None, scales: Scales = None) -> None:
    """RoPE (neox layout, `cos_sin` (P, D) fp32: cos | sin) on q, into `q_out` (default: q
    in place), and on k on its way into the cache, v copied: one launch per layer instead of
    RoPE's and `store_kv`'s. qk_norm (q weight (D,), k weight (D,), eps): RMS-normalize each
    head of q and k first (Qwen3), saving two more launches. q, q_out (T, Hq, D), k, v
    (T, Hkv, D), each token's heads contiguous (views of a fused qkv output are fine); k and
    v quantized with `scales` when the caches are FP8. CUDA-graph safe."""
    tokens, hq, dim = q.shape
    hkv = k.shape[1]
    q_out = q if q_out is None else q_out
    assert k.shape == v.shape == (tokens, hkv, dim) and k_cache.shape[2:] == (hkv, dim)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and cos_sin.shape[1] == dim
    assert q_out.shape == q.shape and q_out.stride()[1:] == (dim, 1)
    assert q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (dim, 1)
    assert dim & (dim - 1) == 0, f"head_dim {dim} must be a power of two"
    k_scale, v_scale = _check_quant(k_cache, v_cache, q.dtype, scales)
    q_w, k_w, eps = qk_norm if qk_norm is not None else (cos_sin, cos_sin, 0.0)  # unread
    if tokens:
        pdl = launches_pdl(q.device)
        _rope_store_kernel[(tokens,)](
            q, k, v, q_out, q.stride(0), k.stride(0), v.stride(0), q_out.stride(0), positions,
            cos_sin, k_cache, v_cache, loc, q_w, k_w, eps, k_scale, v_scale, HQ=hq, HKV=hkv,
            HQ_P2=triton.next_power_of_2(hq), HKV_P2=triton.next_power_of_2(hkv), D=dim,
            NORM=qk_norm is not None, QUANT=scales is not None, PDL=pdl, num_warps=4,
            **({"launch_pdl": True} if pdl else {}))
