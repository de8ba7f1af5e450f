"""Whole-KV paged decode attention in Triton, for the decode CUDA graphs of large batches.

One program per (request, KV head) reads that head's K and V in BLOCK_T-token tiles gathered
through the page ids, holds its whole GQA group, and keeps an online softmax: no split, so
no merge kernel. Programs start with the longest request (`order`, sorted on the host at
plan time), so the long ones do not run alone at the end of the kernel.

Against FlashInfer's tensor-core whole-KV decode, replayed in CUDA graphs at the offline
workload's steps (Qwen3-0.6B's layout, page 16; benches/kernels/triton_decode.py):
3.77 vs 3.61 TB/s at 256 requests, 3.73 vs 3.65 at 153, and 75.6 vs 87.5 us (FlashInfer
split-KV) at 37. A read-only kernel over the same pages reaches ~4.1 TB/s
(benches/kernels/read_floor.py).

An FP8 pool's tiles are upcast to the query's dtype as they are loaded (e4m3 -> bf16 is
exact), its K scale folded into the softmax scale and its V scale applied to the output.
A tile of FP8 is half the bytes of a bf16 one and adds the upcast, so the launch constants
(`LAUNCH`) are chosen per KV dtype, by benches/kernels/triton_decode_sweep.py. They may upcast
FP8 to fp16 instead (one conversion instruction per two values, where bf16 takes several) and
run the dots in fp16 with the query cast too, clamped to fp16's range.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from ..pdl import launches_pdl
from ..transfer import to_device

LOG2E = 1.4426950408889634


class Launch(NamedTuple):
    """The kernel's launch constants: KV tokens per loop step (its tile), warps a program,
    software-pipeline stages of the tile loads (the page ids load a stage ahead of the tiles);
    FP8 pools only: dots in fp16; registers a thread may use (0: the compiler's choice;
    fewer let more programs share an SM, and so more tiles be in flight)."""

    block_t: int
    num_warps: int
    num_stages: int
    fp16_dots: bool = False
    max_registers: int = 0


# Per KV pool dtype (the model's dtype, or FP8), from benches/kernels/triton_decode_sweep.py on
# one H200 (Llama-3.1-8B's heads; batch 256/64/37 x context 512-2048; RESULTS.md). FP8: the
# best over every shape, 1.013x each shape's best on average (128, 4, 2 was 1.190x: FP8 needs
# more loads in flight, hence 6 stages, and fp16 dots halve the upcast's conversions). bf16
# keeps (128, 4, 2): the sweep's (64, 4, 3) was 1.017x against its 1.060x there, but end to
# end it ran Llama-3.1-8B 0.7% faster and Qwen3-0.6B 2.1% slower (one A/B call).
LAUNCH: dict[torch.dtype, Launch] = {
    torch.bfloat16: Launch(128, 4, 2),
    torch.float16: Launch(128, 4, 2),
    torch.float8_e4m3fn: Launch(128, 4, 6, fp16_dots=True),
}


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


@triton.jit(do_not_specialize=["bs"])  # one compile for every batch size
def _decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, indices_ptr, meta_ptr, scale_log2, v_scale,
                   q_stride_t, q_stride_h, bs, HKV: tl.constexpr,
                   GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                   PAGE: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr,
                   FP16_DOTS: tl.constexpr):
    # meta: indptr (bs + 1), last page lengths (bs), order (bs), one int32 buffer.
    b = tl.load(meta_ptr + 2 * bs + 1 + tl.program_id(0))
    h = tl.program_id(1)
    first_page = tl.load(meta_ptr + b)
    num_pages = tl.load(meta_ptr + b + 1) - first_page
    kv_len = (num_pages - 1) * PAGE + tl.load(meta_ptr + bs + 1 + b)
    if PDL:  # the plan was ready before the step; q and the new k, v come from the
        tl.extra.cuda.gdc_wait()  # previous kernel (the RoPE + KV store)
    q, heads, rows = load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP, GP, D)
    if FP16_DOTS:  # the tiles' dtype: the query's range clamped to fp16's (65504)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    d = tl.arange(0, D)
    m_i, l_i, acc = softmax_init(GP, D)
    for t0 in range(0, kv_len, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < kv_len
        k, v = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, valid, h, d, HKV, D, PAGE)
        k, v = k.to(q.dtype), v.to(q.dtype)  # no-ops unless the pool is FP8
        m_i, l_i, acc = online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc)
    store_output(out_ptr, acc * v_scale, l_i, b, heads, rows, HKV * GROUP, D)


def supports(head_dim: int) -> bool:
    """Head dims the kernel takes (a power of two, for its tiles)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


class WholeKVDecode:
    """The kernel's fixed buffers for decode batches of exactly `batch_size` rows: `plan`
    (host, before capture and before every replay) fills them, `run` (capturable) attends.
    `indices` is the device buffer of page ids that the caller fills. `launch`: the kernel's
    constants (benches sweep them); None: LAUNCH's entry for the KV pool's dtype."""

    def __init__(self, batch_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, sm_scale: float, indices: torch.Tensor,
                 launch: Launch | None = None) -> None:
        assert num_qo_heads % num_kv_heads == 0, (num_qo_heads, num_kv_heads)
        assert supports(head_dim), f"head_dim {head_dim} is not a power of 2 >= 16"
        self.bs, self.hq, self.hkv, self.d = batch_size, num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.indices, self.launch = page_size, indices, launch
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
            out: torch.Tensor | None = None, k_scale: float = 1.0,
            v_scale: float = 1.0) -> torch.Tensor:
        """q (bs, Hq, D), rows and heads strided as given (the last dim contiguous); kv_cache
        one layer's k and v, each (pages, page_size, Hkv, D), in q's dtype or FP8 holding
        value / scale -> out (bs, Hq, D), contiguous. (FlashInfer's wrappers' signature.)"""
        k_cache, v_cache = kv_cache
        assert q.shape == (self.bs, self.hq, self.d) and q.stride(2) == 1, q.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        assert k_cache.dtype in (q.dtype, torch.float8_e4m3fn), (k_cache.dtype, q.dtype)
        if out is None:
            out = torch.empty((self.bs, self.hq, self.d), dtype=q.dtype, device=q.device)
        assert out.shape == q.shape and out.is_contiguous(), (out.shape, out.stride())
        group, pdl = self.hq // self.hkv, launches_pdl(q.device)
        launch = self.launch or LAUNCH[k_cache.dtype]
        assert k_cache.dtype == torch.float8_e4m3fn or not launch.fp16_dots, launch
        _decode_kernel[(self.bs, self.hkv)](
            q, k_cache, v_cache, out, self.indices, self._meta, self.scale_log2 * k_scale,
            v_scale, q.stride(0), q.stride(1), self.bs, HKV=self.hkv, GROUP=group,
            GP=max(16, triton.next_power_of_2(group)), D=self.d, PAGE=self.page_size,
            BLOCK_T=launch.block_t, PDL=pdl, num_warps=launch.num_warps,
            num_stages=launch.num_stages, FP16_DOTS=launch.fp16_dots,
            **({"launch_pdl": True} if pdl else {}),
            **({"maxnreg": launch.max_registers} if launch.max_registers else {}))
        return out
