"""Attention for mixed steps (decodes first, then up to MAX_CHUNKS prompt chunks) captured
whole in a CUDA graph of a fixed row count (engine/mixed.py).

One FlashInfer prefill plan cannot be captured for such a step: in CUDA-graph mode FA2
sizes its query tiles for the worst case, one request holding every row, so each one-row
decode would pay a 64- or 128-row tile. So the step's attention is two kernels, each with
a plan that a graph can replay:
- FA2's prefill kernel in CUDA-graph mode over a fixed batch of 1 + MAX_CHUNKS requests:
  a stand-in for the decode rows (request 0: as many rows as there are decodes, if any,
  attending causally over as many tokens of the pool's dummy page, so it is cheap and never
  fully masked), then the prompt chunks, then zero-row requests to fill the batch;
- our whole-KV decode kernel (triton_decode.py) over the decode rows, which writes only
  those rows, over the stand-in's output.
Rows past the step's tokens (the graph's padding) are attended by neither; their output is
stale, as in the piecewise graphs, and nothing reads it.

A size's plan is refilled before every replay (`plan`): page ids are gathered on the device
(page_ids.py) into two buffers of this class, the decode kernel's and the prefill
wrappers'; the indptrs and last-page lengths cross from the host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .flashinfer_backend import gather_pages
from .flashinfer_kernels import FlashInferPagedAttention

if TYPE_CHECKING:
    from .triton_decode import WholeKVDecode

MAX_CHUNKS = 4  # prompt chunks a mixed graph takes (a capped step has 1-3)


class MixedGraphAttention:
    def __init__(self, attn: FlashInferPagedAttention, page_table: torch.Tensor,
                 sizes: Sequence[int], dummy_page: int, max_pages_per_req: int) -> None:
        """sizes: the graphs' row counts; dummy_page: a page no request owns."""
        import flashinfer

        from .triton_decode import WholeKVDecode  # imports triton: CUDA only

        self.attn, self.page_table, self.dummy_page = attn, page_table, dummy_page
        dev, max_rows = attn.device, max(sizes)
        # Page-id buffers of their own: a mixed graph may have more rows than the largest
        # decode graph, whose buffer is sized for that.
        self._decode_ids = torch.zeros(max_rows * max_pages_per_req, dtype=torch.int32,
                                       device=dev)
        prefill_pages = -(-max_rows // attn.page_size) + MAX_CHUNKS * (max_pages_per_req + 1)
        self._prefill_ids = torch.zeros(prefill_pages, dtype=torch.int32, device=dev)
        self._gathered = torch.zeros_like(self._prefill_ids)  # plan copies it into the above
        n = MAX_CHUNKS + 1
        self._qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self._kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self._last_page_len = torch.ones(n, dtype=torch.int32, device=dev)
        self._decode: dict[int, WholeKVDecode] = {}
        self._prefill: dict[int, Any] = {}
        for size in sizes:
            self._decode[size] = WholeKVDecode(size, attn.num_qo_heads, attn.num_kv_heads,
                                               attn.head_dim, attn.page_size, attn.sm_scale,
                                               self._decode_ids)
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                attn._float_ws, attn.kv_layout, use_cuda_graph=True, backend="fa2",
                qo_indptr_buf=self._qo_indptr, paged_kv_indptr_buf=self._kv_indptr,
                paged_kv_indices_buf=self._prefill_ids,
                paged_kv_last_page_len_buf=self._last_page_len,
            )
            wrapper._int_workspace_buffer = attn._int_ws  # shared, see flashinfer_kernels
            wrapper._pin_memory_int_workspace_buffer = attn._pinned_ws
            self._prefill[size] = wrapper
        self._size = 0

    def plan(self, size: int, decodes: tuple[Sequence[int], Sequence[int]],
             chunks: tuple[Sequence[int], Sequence[int], Sequence[int]]) -> None:
        """Plan a step for the graph of `size` rows: decodes (page-table rows, KV lengths
        with the new token), then chunks (page-table rows, KV lengths with the chunk, chunk
        lengths). Call before capturing that size and before every replay; the backend's
        `run` then attends through this plan (until the next plan of another kind)."""
        (d_rows, d_lens), (c_rows, c_lens, c_q) = decodes, chunks
        num_decodes, pad = len(d_rows), MAX_CHUNKS - len(c_rows)
        assert pad >= 0 and len(c_rows) >= 1, (num_decodes, len(c_rows))
        assert num_decodes + sum(c_q) <= size, (num_decodes, sum(c_q), size)
        attn, rest = self.attn, size - num_decodes
        attn._plan_done.synchronize()
        # The decode rows, padded to the graph's rows with one-token requests on the dummy
        # page; the kernel writes rows 0..num_decodes only.
        indptr, last = gather_pages(self.page_table, [*d_rows, *[-1] * rest],
                                    [*d_lens, *[1] * rest], attn.page_size, self.dummy_page,
                                    self._decode_ids)
        self._decode[size].plan(torch.from_numpy(indptr), torch.from_numpy(last), num_decodes)
        # The prefill kernel's batch: the decode rows' stand-in, the chunks, empty requests.
        q_lens = np.array([num_decodes, *c_q, *[0] * pad], dtype=np.int64)
        indptr, last = gather_pages(self.page_table, [-1, *c_rows, *[-1] * pad],
                                    [max(num_decodes, 1), *c_lens, *[1] * pad], attn.page_size,
                                    self.dummy_page, self._gathered)
        qo_indptr = np.zeros(len(q_lens) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo_indptr[1:])
        self._prefill[size].plan(
            torch.from_numpy(qo_indptr), torch.from_numpy(indptr),
            self._gathered[: int(indptr[-1])], torch.from_numpy(last),
            attn.num_qo_heads, attn.num_kv_heads, attn.head_dim, attn.page_size, causal=True,
            sm_scale=attn.sm_scale, q_data_type=attn.dtype, kv_data_type=attn.dtype,
        )
        attn._plan_done.record()
        self._size = size
        attn.activate(self)

    def run(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q (size, Hq, D) -> out (size, Hq, D): the prompt rows from the prefill kernel,
        then the decode rows over the stand-in's. Capturable."""
        size = self._size
        assert q.shape[0] == size, (q.shape, size)
        if out is None:
            out = torch.empty((size, self.attn.num_qo_heads, self.attn.head_dim),
                              dtype=q.dtype, device=q.device)
        self._prefill[size].run(q, kv_cache, out=out)
        return self._decode[size].run(q, kv_cache, out=out)

