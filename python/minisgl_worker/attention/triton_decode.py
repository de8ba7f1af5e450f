"""Whole-KV paged decode attention in Triton, for the decode CUDA graphs of large batches.

One program per (request, KV head) reads that head's K and V in BLOCK_T-token tiles gathered
through the page ids, holds its whole GQA group, and keeps an online softmax: no split, so
no merge kernel. Programs start with the longest request (`order`, sorted on the host at
plan time), so the long ones do not run alone at the end of the kernel.

Against FlashInfer's tensor-core whole-KV decode, replayed in CUDA graphs at the offline
workload's steps (Qwen3-0.6B's layout, page 16; benches/triton_decode.py, RESULTS.md):
3.77 vs 3.61 TB/s at 256 requests, 3.73 vs 3.65 at 153, and 75.6 vs 87.5 us (FlashInfer
split-KV) at 37. A read-only kernel over the same pages reaches ~4.1 TB/s
(benches/read_floor.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from ..kvcache.store import norm_rope
from ..pdl import launches_pdl
from ..transfer import to_device

LOG2E = 1.4426950408889634
BLOCK_T, NUM_WARPS, NUM_STAGES = 128, 4, 2  # the bench's best at every step it timed


@triton.jit
def gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, valid, h, d,
                HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """K and V of KV head h at a request's token positions t (those not `valid` read as 0),
    through its page ids at indices[first_page:] -> two (len(t), D) tiles."""
    page = tl.load(indices_ptr + first_page + t // PAGE, mask=valid, other=0)
    row = ((page.to(tl.int64) * PAGE + t % PAGE) * HKV + h) * D
    k = tl.load(k_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    return k, v


@triton.jit
def load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP: tl.constexpr,
                     GP: tl.constexpr, D: tl.constexpr):
    """Request b's query heads of KV head h -> (q (GP, D), rows padded past GROUP with 0;
    their query head ids (GP,); which rows are real (GP,))."""
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    heads = h * GROUP + g
    rows = g < GROUP
    q = tl.load(q_ptr + b * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
                mask=rows[:, None], other=0.0)
    return q, heads, rows


@triton.jit
def softmax_init(GP: tl.constexpr, D: tl.constexpr):
    """The online softmax's empty state for GP query rows of head dim D -> (running max
    m_i, sum l_i, unnormalized output acc), as `softmax_update` takes them."""
    return (tl.full((GP,), float("-inf"), tl.float32), tl.zeros((GP,), tl.float32),
            tl.zeros((GP, D), tl.float32))


@triton.jit
def softmax_update(s, v, m_i, l_i, acc):
    """The online softmax's update with one tile: scores s (rows, tile) in log2 units (-inf
    where masked) and values v (tile, D), into the running max m_i, sum l_i and
    unnormalized output acc -> (m_i, l_i, acc)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc):
    """One tile of the online softmax: the query rows q against keys k (tokens not `valid`
    masked) and values v -> (m_i, l_i, acc) as `softmax_update`."""
    qk = tl.dot(q, tl.trans(k)) * scale_log2  # (rows, tile), in log2 units
    qk = tl.where(valid[None, :], qk, float("-inf"))
    return softmax_update(qk, v, m_i, l_i, acc)


@triton.jit
def store_output(out_ptr, acc, l_i, b, heads, rows, HQ: tl.constexpr, D: tl.constexpr):
    """acc / l_i into out (bs, HQ, D), contiguous, at request b's query `heads` where
    `rows`."""
    d = tl.arange(0, D)
    tl.store(out_ptr + (b * HQ + heads)[:, None] * D + d[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=rows[:, None])


@triton.jit
def rope_and_store_new(q_ptr, k_ptr, v_ptr, q_stride_t, kv_stride_t, k_cache_ptr, v_cache_ptr,
                       loc_ptr, pos_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, eps, b, h,
                       HKV: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr,
                       D: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    """What the RoPE + KV store kernel (kvcache/store.py) does for request b's new token, for
    KV head h and its query group: k rotated (RMS-normalized first when NORM) into the cache
    slot, v copied there, and -> the group's rotated queries (GP, D), rows past GROUP 0."""
    slot = tl.load(loc_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    half = tl.arange(0, D // 2)[None, :]
    cos = tl.load(cos_sin_ptr + pos * D + half)
    sin = tl.load(cos_sin_ptr + pos * D + D // 2 + half)
    if PDL:  # the slots, positions and cos/sin were ready before the step; q, k and v come
        tl.extra.cuda.gdc_wait()  # from the previous kernel (the qkv projection)
    g = tl.arange(0, GP)[:, None]
    q_lo = q_ptr + b * q_stride_t + (h * GROUP + g) * D + half
    q1, q2 = norm_rope(q_lo, q_norm_ptr, cos, sin, eps, g < GROUP, D, NORM)
    k_lo = k_ptr + b * kv_stride_t + h * D + half
    k1, k2 = norm_rope(k_lo, k_norm_ptr, cos, sin, eps, half < D // 2, D, NORM)
    dst = (slot * HKV + h) * D + half
    dt = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + dst, k1.to(dt))
    tl.store(k_cache_ptr + dst + D // 2, k2.to(dt))
    d = tl.arange(0, D)
    tl.store(v_cache_ptr + (slot * HKV + h) * D + d, tl.load(v_ptr + b * kv_stride_t + h * D + d))
    tl.debug_barrier()  # the attention loop reads the slot back: visible to every thread
    q = tl.join(q1.to(q_ptr.dtype.element_ty), q2.to(q_ptr.dtype.element_ty))  # (GP, D/2, 2)
    return tl.reshape(tl.permute(q, (0, 2, 1)), (GP, D))  # the halves side by side


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, indices_ptr, meta_ptr, scale_log2,
                   q_stride_t, q_stride_h, bs, k_new_ptr, v_new_ptr, kv_new_stride_t, loc_ptr,
                   pos_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, eps, HKV: tl.constexpr,
                   GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                   PAGE: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr,
                   ROPE: tl.constexpr, NORM: tl.constexpr):
    # meta: indptr (bs + 1), last page lengths (bs), order (bs), one int32 buffer.
    b = tl.load(meta_ptr + 2 * bs + 1 + tl.program_id(0))
    h = tl.program_id(1)
    first_page = tl.load(meta_ptr + b)
    num_pages = tl.load(meta_ptr + b + 1) - first_page
    kv_len = (num_pages - 1) * PAGE + tl.load(meta_ptr + bs + 1 + b)
    if ROPE:  # q, k, v as the projection left them: rotate, store k and v, then attend
        q = rope_and_store_new(q_ptr, k_new_ptr, v_new_ptr, q_stride_t, kv_new_stride_t,
                               k_ptr, v_ptr, loc_ptr, pos_ptr, cos_sin_ptr, q_norm_ptr,
                               k_norm_ptr, eps, b, h, HKV, GROUP, GP, D, NORM, PDL)
    else:
        if PDL:  # the plan was ready before the step; q and the new k, v come from the
            tl.extra.cuda.gdc_wait()  # previous kernel (the RoPE + KV store)
        q, _, _ = load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP, GP, D)
    d = tl.arange(0, D)
    m_i, l_i, acc = softmax_init(GP, D)
    for t0 in range(0, kv_len, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < kv_len
        k, v = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, valid, h, d, HKV, D, PAGE)
        m_i, l_i, acc = online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc)
    g = tl.arange(0, GP)
    store_output(out_ptr, acc, l_i, b, h * GROUP + g, g < GROUP, HKV * GROUP, D)


class NewTokens(NamedTuple):
    """A decode step's new k and v, each (bs, Hkv, D) as the qkv projection left them (each
    token's heads contiguous), and what rotates them. Given these, the kernel does the RoPE
    + KV store kernel's work itself (kvcache/store.py: q and k RMS-normalized when
    `qk_norm`, then rotated; k and v stored at `out_loc`) before it attends: one launch a
    layer fewer."""

    k: torch.Tensor
    v: torch.Tensor
    out_loc: torch.Tensor  # (bs,) the new tokens' KV slots
    positions: torch.Tensor  # (bs,)
    cos_sin: torch.Tensor  # (max positions, D) float32, cos | sin (layers/cuda_ops.py)
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None  # q, k weights; eps


def supports(head_dim: int) -> bool:
    """Head dims the kernel takes (a power of two, for its tiles)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


class WholeKVDecode:
    """The kernel's fixed buffers for decode batches of exactly `batch_size` rows: `plan`
    (host, before capture and before every replay) fills them, `run` (capturable) attends.
    `indices` is the device buffer of page ids that the caller fills."""

    def __init__(self, batch_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, sm_scale: float, indices: torch.Tensor) -> None:
        assert num_qo_heads % num_kv_heads == 0, (num_qo_heads, num_kv_heads)
        assert supports(head_dim), f"head_dim {head_dim} is not a power of 2 >= 16"
        self.bs, self.hq, self.hkv, self.d = batch_size, num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.indices = page_size, indices
        self.scale_log2 = sm_scale * LOG2E
        self._meta = torch.empty(3 * batch_size + 1, dtype=torch.int32, device=indices.device)

    def plan(self, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> None:
        """The padded batch's int32 metadata, from host tensors, into the graphs' buffer
        (through the copy stream: a device-to-device copy stays on the compute stream)."""
        bs = self.bs
        assert kv_last_page_len.numel() == bs, (kv_last_page_len.numel(), bs)
        indptr, last = kv_indptr.numpy(), kv_last_page_len.numpy()
        lens = (np.diff(indptr) - 1) * self.page_size + last
        order = np.argsort(-lens, kind="stable")
        meta = np.concatenate([indptr, last, order]).astype(np.int32)
        self._meta.copy_(to_device(meta, self._meta.device, torch.int32))

    def run(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
            out: torch.Tensor | None = None, new: NewTokens | None = None) -> torch.Tensor:
        """q (bs, Hq, D), rows and heads strided as given (the last dim contiguous); kv_cache
        one layer's k and v, each (pages, page_size, Hkv, D) -> out (bs, Hq, D), contiguous.
        (FlashInfer's wrappers' signature.) With `new`, q and the new k, v are as the qkv
        projection left them: the kernel rotates them and stores k, v first (NewTokens)."""
        k_cache, v_cache = kv_cache
        assert q.shape == (self.bs, self.hq, self.d) and q.stride(2) == 1, q.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        if out is None:
            out = torch.empty((self.bs, self.hq, self.d), dtype=q.dtype, device=q.device)
        assert out.shape == q.shape and out.is_contiguous(), (out.shape, out.stride())
        group, pdl = self.hq // self.hkv, launches_pdl(q.device)
        _decode_kernel[(self.bs, self.hkv)](
            q, k_cache, v_cache, out, self.indices, self._meta, self.scale_log2,
            q.stride(0), q.stride(1), self.bs, *self._new_args(q, new), HKV=self.hkv,
            GROUP=group, GP=max(16, triton.next_power_of_2(group)), D=self.d,
            PAGE=self.page_size, BLOCK_T=BLOCK_T, PDL=pdl, ROPE=new is not None,
            NORM=new is not None and new.qk_norm is not None, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, **({"launch_pdl": True} if pdl else {}))
        return out

    def _new_args(self, q: torch.Tensor, new: NewTokens | None) -> tuple:
        """The kernel's arguments for the new tokens (q's and the plan's buffers in their
        place when there are none: the kernel does not read them then)."""
        if new is None:
            return q, q, 0, self._meta, self._meta, q, q, q, 0.0
        shape = (self.bs, self.hkv, self.d)
        assert q.stride(1) == self.d, "the fused RoPE takes each token's q heads contiguous"
        assert new.k.shape == new.v.shape == shape and new.k.stride() == new.v.stride()
        assert new.k.stride()[1:] == (self.d, 1), new.k.stride()
        assert new.out_loc.shape == new.positions.shape == (self.bs,)
        assert new.cos_sin.shape[1] == self.d and new.cos_sin.dtype == torch.float32
        q_w, k_w, eps = new.qk_norm if new.qk_norm is not None else (q, q, 0.0)
        return (new.k, new.v, new.k.stride(0), new.out_loc, new.positions, new.cos_sin,
                q_w, k_w, eps)
