"""Paged attention in Triton for the CUDA graphs of large decode batches and of small mixed
steps, without a split of the KV: each program reads one query segment's keys whole.

A segment is up to SEG = GP // GROUP consecutive query tokens of one request (a decode is a
segment of one token) with that request's GQA group packed token-major into GP = 16 query
rows. One program per (segment, KV head) reads that head's K and V in BLOCK_T-token tiles
gathered through the page ids and keeps an online softmax: no split, so no merge kernel.
Segments are planned on the host (`plan_segments`), longest KV first, so the long programs
do not run alone at the end of the kernel. In a mixed step (`causal`) a prompt chunk is cut
into segments and each query row sees the keys up to its own position; a grid holds as many
segments as its graph has rows, and the programs past the step's segments return at once.

Against FlashInfer's tensor-core whole-KV decode, replayed in CUDA graphs at the offline
workload's steps (Qwen3-0.6B's layout, page 16; benches/triton_decode.py, RESULTS.md):
3.77 vs 3.61 TB/s at 256 requests, 3.73 vs 3.65 at 153, and 75.6 vs 87.5 us (FlashInfer
split-KV) at 37. A read-only kernel over the same pages reaches ~4.1 TB/s
(benches/read_floor.py). In mixed steps it replaces FA2's prefill kernel in CUDA-graph mode,
which has the same 16-row tile (attention/mixed_graph.py).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

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
def load_query_rows(q_ptr, q0, n, h, q_stride_t, q_stride_h, GROUP: tl.constexpr,
                    GP: tl.constexpr, D: tl.constexpr):
    """Query tokens q0..q0+n-1 x the query heads of KV head h, packed token-major into GP
    rows -> (q (GP, D), zero in rows past n x GROUP; each row's token offset in the segment
    (GP,); its query head (GP,); which rows are real (GP,))."""
    r = tl.arange(0, GP)
    i = r // GROUP
    heads = h * GROUP + r % GROUP
    rows = i < n
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (q0 + i)[:, None] * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
                mask=rows[:, None], other=0.0)
    return q, i, heads, rows


@triton.jit
def load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP: tl.constexpr,
                     GP: tl.constexpr, D: tl.constexpr):
    """Request b's one query token x the query heads of KV head h -> (q (GP, D), rows padded
    past GROUP with 0; their query head ids (GP,); which rows are real (GP,))."""
    q, _, heads, rows = load_query_rows(q_ptr, b, 1, h, q_stride_t, q_stride_h, GROUP, GP, D)
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
def online_softmax_step(q, k, v, visible, scale_log2, m_i, l_i, acc):
    """One tile of the online softmax: the query rows q against keys k and values v, keys
    not `visible` masked ((tile,), or (rows, tile) for a causal mask; every row must see at
    least one key of the first tile) -> (m_i, l_i, acc) as `softmax_update`."""
    qk = tl.dot(q, tl.trans(k)) * scale_log2  # (rows, tile), in log2 units
    qk = tl.where(visible, qk, float("-inf"))
    return softmax_update(qk, v, m_i, l_i, acc)


@triton.jit
def store_output(out_ptr, acc, l_i, tok, heads, rows, HQ: tl.constexpr, D: tl.constexpr):
    """acc / l_i into out (T, HQ, D), contiguous, at token rows `tok` (one, or one per row)
    and query `heads`, where `rows`."""
    d = tl.arange(0, D)
    tl.store(out_ptr + (tok * HQ + heads)[:, None] * D + d[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=rows[:, None])


@triton.jit
def _segments_kernel(q_ptr, k_ptr, v_ptr, out_ptr, indices_ptr, meta_ptr, scale_log2,
                     q_stride_t, q_stride_h, max_segments, HKV: tl.constexpr,
                     GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                     PAGE: tl.constexpr, BLOCK_T: tl.constexpr, CAUSAL: tl.constexpr,
                     PDL: tl.constexpr):
    # meta (int32): the segment count; per segment slot (SoA, max_segments each) its
    # request, first query row, query tokens and the keys it sees; the requests' page indptr.
    # (Fixed offsets: a CUDA graph replays the arguments it was captured with.) Programs
    # run head by head, each head's segments longest first; the grid's spare programs
    # (slots past the step's segments) come last and return at once.
    count = tl.load(meta_ptr)
    p = tl.program_id(0)
    s = p % count
    h = p // count
    if h < HKV:
        seg = meta_ptr + 1 + s
        b = tl.load(seg)
        q0 = tl.load(seg + max_segments)
        n = tl.load(seg + 2 * max_segments)
        kv_len = tl.load(seg + 3 * max_segments)
        first_page = tl.load(meta_ptr + 1 + 4 * max_segments + b)
        if PDL:  # the plan was ready before the step; q and the new k, v come from the
            tl.extra.cuda.gdc_wait()  # previous kernel (the RoPE + KV store)
        q, i, heads, rows = load_query_rows(q_ptr, q0, n, h, q_stride_t, q_stride_h, GROUP,
                                            GP, D)
        last = kv_len - n + i  # each row's own position, the last key it sees
        d = tl.arange(0, D)
        m_i, l_i, acc = softmax_init(GP, D)
        for t0 in range(0, kv_len, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            valid = t < kv_len
            k, v = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, valid, h, d, HKV, D,
                               PAGE)
            if CAUSAL:
                visible = valid[None, :] & (t[None, :] <= last[:, None])
                m_i, l_i, acc = online_softmax_step(q, k, v, visible, scale_log2, m_i, l_i, acc)
            else:  # one token a segment: it sees every key
                m_i, l_i, acc = online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc)
        store_output(out_ptr, acc, l_i, q0 + i, heads, rows, HKV * GROUP, D)


def supports(head_dim: int) -> bool:
    """Head dims the kernel takes (a power of two, for its tiles)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def query_rows(group: int) -> int:
    """GP, the packed query rows of a program: 16 (the smallest tensor-core dot), or the
    GQA group rounded up to a power of two when that is larger."""
    return max(16, triton.next_power_of_2(group))


def plan_segments(kv_lens: np.ndarray, q_lens: np.ndarray, per: int,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each request's query tokens (the last q_lens of its kv_lens keys) cut into segments of
    at most `per` -> per segment (request, first query row, tokens, keys it sees), longest
    first (stable). A request with no query tokens has no segment."""
    q_lens = np.asarray(q_lens, dtype=np.int64)
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    counts = -(-q_lens // per)
    req = np.repeat(np.arange(len(q_lens)), counts)
    first = np.cumsum(counts) - counts  # each request's first segment
    j = (np.arange(int(counts.sum())) - first[req]) * per  # offset in the request's query
    n = np.minimum(per, q_lens[req] - j)
    keys = kv_lens[req] - q_lens[req] + j + n
    q0 = (np.cumsum(q_lens) - q_lens)[req] + j
    order = np.argsort(-keys, kind="stable")
    return req[order], q0[order], n[order], keys[order]


class SegmentAttention:
    """The kernel's fixed buffers for up to `max_segments` segments of a batch of at most
    `max_requests` requests: `plan_segments` (host, before capture and before every replay)
    fills them, `run` (capturable) attends. `indices` is the device buffer of page ids that
    the caller fills; `causal`: segments of several tokens (mixed steps)."""

    def __init__(self, max_segments: int, max_requests: int, num_qo_heads: int,
                 num_kv_heads: int, head_dim: int, page_size: int, sm_scale: float,
                 indices: torch.Tensor, causal: bool) -> None:
        assert num_qo_heads % num_kv_heads == 0, (num_qo_heads, num_kv_heads)
        assert supports(head_dim), f"head_dim {head_dim} is not a power of 2 >= 16"
        self.hq, self.hkv, self.d = num_qo_heads, num_kv_heads, head_dim
        self.group = num_qo_heads // num_kv_heads
        self.per_segment = query_rows(self.group) // self.group if causal else 1
        self.page_size, self.indices, self.causal = page_size, indices, causal
        self.max_segments, self.max_requests = max_segments, max_requests
        self.scale_log2 = sm_scale * LOG2E
        self._meta = torch.empty(1 + 4 * max_segments + max_requests + 1, dtype=torch.int32,
                                 device=indices.device)
        self._grid = 0

    def plan_segments(self, kv_indptr: np.ndarray, kv_lens: np.ndarray, q_lens: np.ndarray,
                      grid: int) -> None:
        """A batch's pages (CSR over `indices`), keys and query tokens per request, for a
        launch of `grid` segment slots (the graph's: fixed at capture) -> the int32 metadata,
        through the copy stream into the buffer (a device-to-device copy would stay on the
        compute stream)."""
        bs = len(q_lens)
        segments = plan_segments(kv_lens, q_lens, self.per_segment)
        count = len(segments[0])
        assert bs <= self.max_requests and 0 < count <= grid <= self.max_segments, (
            bs, count, grid)
        meta = np.zeros(1 + 4 * self.max_segments + bs + 1, dtype=np.int32)
        meta[0] = count
        for f, field in enumerate(segments):
            meta[1 + f * self.max_segments :][:count] = field
        meta[1 + 4 * self.max_segments :] = kv_indptr
        self._meta[: len(meta)].copy_(to_device(meta, self._meta.device, torch.int32))
        self._grid = grid

    def run(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q (T, Hq, D), rows and heads strided as given (the last dim contiguous); kv_cache
        one layer's k and v, each (pages, page_size, Hkv, D) -> out (T, Hq, D), contiguous,
        written at the planned segments' rows only. (FlashInfer's wrappers' signature.)"""
        k_cache, v_cache = kv_cache
        assert self._grid, "plan_segments first"
        assert q.shape[1:] == (self.hq, self.d) and q.stride(2) == 1, q.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        if out is None:
            out = torch.empty((q.shape[0], self.hq, self.d), dtype=q.dtype, device=q.device)
        assert out.shape == q.shape and out.is_contiguous(), (out.shape, out.stride())
        pdl = launches_pdl(q.device)
        _segments_kernel[(self._grid * self.hkv,)](
            q, k_cache, v_cache, out, self.indices, self._meta, self.scale_log2,
            q.stride(0), q.stride(1), self.max_segments, HKV=self.hkv,
            GROUP=self.group, GP=query_rows(self.group), D=self.d, PAGE=self.page_size,
            BLOCK_T=BLOCK_T, CAUSAL=self.causal, PDL=pdl, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, **({"launch_pdl": True} if pdl else {}))
        return out


class WholeKVDecode(SegmentAttention):
    """The decode graphs' kernel for batches of exactly `batch_size` rows: one segment of
    one token a request."""

    def __init__(self, batch_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, sm_scale: float, indices: torch.Tensor) -> None:
        super().__init__(batch_size, batch_size, num_qo_heads, num_kv_heads, head_dim,
                         page_size, sm_scale, indices, causal=False)
        self.bs = batch_size

    def plan(self, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> None:
        """The padded batch's pages, from host tensors (FlashInfer's CSR form)."""
        assert kv_last_page_len.numel() == self.bs, (kv_last_page_len.numel(), self.bs)
        indptr, last = kv_indptr.numpy(), kv_last_page_len.numpy()
        lens = (np.diff(indptr) - 1) * self.page_size + last
        self.plan_segments(indptr, lens, np.ones(self.bs, dtype=np.int64), self.bs)
