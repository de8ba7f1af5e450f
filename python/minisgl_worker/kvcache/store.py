"""Writing a layer's new k and v into the paged pool on CUDA: one Triton program per token
copies its k row and its v row to its slot, one launch per layer. The torch way (two
indexed copies) is two launches of ~3.4 us each, 28-32 layers per decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_stride, v_stride, k_cache_ptr, v_cache_ptr, loc_ptr,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    for start in tl.static_range(0, ROW, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < ROW
        k = tl.load(k_ptr + t * k_stride + cols, mask=mask)
        v = tl.load(v_ptr + t * v_stride + cols, mask=mask)
        tl.store(k_cache_ptr + slot * ROW + cols, k, mask=mask)
        tl.store(v_cache_ptr + slot * ROW + cols, v, mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k, v (T, Hkv, D), each token's heads contiguous (views of a fused qkv output are
    fine) -> one layer's caches (pages, page_size, Hkv, D) at slots `loc` (T,).
    CUDA-graph safe."""
    tokens, heads, dim = k.shape
    row = heads * dim
    assert v.shape == k.shape and k_cache.shape[2:] == (heads, dim) and k_cache.is_contiguous()
    assert v_cache.is_contiguous() and k.stride()[1:] == v.stride()[1:] == (dim, 1)
    if tokens:
        block = min(triton.next_power_of_2(row), 4096)
        _store_kv_kernel[(tokens,)](k, v, k.stride(0), v.stride(0), k_cache, v_cache, loc,
                                    ROW=row, BLOCK=block, num_warps=4)


@triton.jit
def _rope_store_kernel(q_ptr, k_ptr, v_ptr, q_stride, k_stride, v_stride, pos_ptr, cos_sin_ptr,
                       k_cache_ptr, v_cache_ptr, loc_ptr,
                       HQ: tl.constexpr, HKV: tl.constexpr, HQ_P2: tl.constexpr,
                       HKV_P2: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    half = tl.arange(0, D // 2)
    cos = tl.load(cos_sin_ptr + pos * D + half)[None, :]
    sin = tl.load(cos_sin_ptr + pos * D + D // 2 + half)[None, :]
    # q: rotate each head in place (neox layout: the halves of a head pair up)
    hq = tl.arange(0, HQ_P2)[:, None]
    q_lo = q_ptr + t * q_stride + hq * D + half[None, :]
    q1 = tl.load(q_lo, mask=hq < HQ).to(tl.float32)
    q2 = tl.load(q_lo + D // 2, mask=hq < HQ).to(tl.float32)
    tl.store(q_lo, (q1 * cos - q2 * sin).to(q_ptr.dtype.element_ty), mask=hq < HQ)
    tl.store(q_lo + D // 2, (q2 * cos + q1 * sin).to(q_ptr.dtype.element_ty), mask=hq < HQ)
    # k: rotate into the cache slot; v: copy
    hk = tl.arange(0, HKV_P2)[:, None]
    k_lo = k_ptr + t * k_stride + hk * D + half[None, :]
    k1 = tl.load(k_lo, mask=hk < HKV).to(tl.float32)
    k2 = tl.load(k_lo + D // 2, mask=hk < HKV).to(tl.float32)
    dst = k_cache_ptr + slot * HKV * D + hk * D + half[None, :]
    tl.store(dst, (k1 * cos - k2 * sin).to(k_cache_ptr.dtype.element_ty), mask=hk < HKV)
    tl.store(dst + D // 2, (k2 * cos + k1 * sin).to(k_cache_ptr.dtype.element_ty), mask=hk < HKV)
    cols = hk * D + tl.arange(0, D)[None, :]
    v = tl.load(v_ptr + t * v_stride + cols, mask=hk < HKV)
    tl.store(v_cache_ptr + slot * HKV * D + cols, v, mask=hk < HKV)


def rope_store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
                  positions: torch.Tensor, cos_sin: torch.Tensor, q: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor) -> None:
    """RoPE (neox layout, `cos_sin` (P, D) fp32: cos | sin) on q in place and on k on its
    way into the cache, v copied: one launch per layer instead of RoPE's and `store_kv`'s.
    q (T, Hq, D), k, v (T, Hkv, D), each token's heads contiguous (views of a fused qkv
    output are fine). CUDA-graph safe."""
    tokens, hq, dim = q.shape
    hkv = k.shape[1]
    assert k.shape == v.shape == (tokens, hkv, dim) and k_cache.shape[2:] == (hkv, dim)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and cos_sin.shape[1] == dim
    assert q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (dim, 1)
    assert dim & (dim - 1) == 0, f"head_dim {dim} must be a power of two"
    if tokens:
        _rope_store_kernel[(tokens,)](
            q, k, v, q.stride(0), k.stride(0), v.stride(0), positions, cos_sin, k_cache,
            v_cache, loc, HQ=hq, HKV=hkv, HQ_P2=triton.next_power_of_2(hq),
            HKV_P2=triton.next_power_of_2(hkv), D=dim, num_warps=4)
