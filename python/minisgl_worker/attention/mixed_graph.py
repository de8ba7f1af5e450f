"""Attention for mixed steps (decodes and prompt chunks, in any order) captured whole in a
CUDA graph of a fixed row count (engine/graphs/mixed.py): FA2's prefill kernel, one launch,
as the piecewise graphs' eager plan runs such a step (flashinfer_kernels.py: Attn.MIXED_FA2),
with a plan a graph can replay.

In CUDA-graph mode FA2 fixes its query tile at capture, for the worst case the capture's
row and request counts allow (scheduler.cuh: `max_seq_len = total_rows - batch + 1`). So
each graph of `size` rows is planned over a batch of `size` requests: captured with one row
each, it gets the 16-row tile that the eager plan picks for batches of one-token decodes
and short chunks, and every later step fits it, padded with zero-row requests on the
pool's dummy page. The split of long KV is switched off (in graph mode FA2 would always
split, then merge: 22 us a layer on Llama-3.1-8B's capped steps, 2026-12-02); the eager plan
does not split either once the batch fills the GPU (engine/route.py takes only such steps).

A size's plan is refilled before every replay (`plan`): page ids are gathered on the device
(page_ids.py), the indptrs and last-page lengths cross from the host. Rows past the step's
tokens (the graph's padding) are not attended; their output is stale, as in the piecewise
graphs, and nothing reads it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .flashinfer_kernels import FlashInferPagedAttention
from .flashinfer_meta import gather_pages

QUERY_TILE = 16  # the packed query rows (tokens x GQA group) of the graphs' FA2 tile


class MixedGraphAttention:
    def __init__(self, attn: FlashInferPagedAttention, page_table: torch.Tensor,
                 sizes: Sequence[int], dummy_page: int, max_pages_per_req: int) -> None:
        """sizes: the graphs' row counts; dummy_page: a page no request owns."""
        import flashinfer

        self.attn, self.page_table, self.dummy_page = attn, page_table, dummy_page
        dev, max_rows = attn.device, max(sizes)
        # A step of `size` rows has at most `size` requests, each within max_pages_per_req.
        self._page_ids = torch.zeros(max_rows * max_pages_per_req, dtype=torch.int32,
                                     device=dev)
        self._gathered = torch.zeros_like(self._page_ids)  # plan copies it into the above
        self._qo_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=dev)
        self._kv_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=dev)
        self._last_page_len = torch.ones(max_rows, dtype=torch.int32, device=dev)
        self._wrappers: dict[int, Any] = {}
        for size in sizes:  # a wrapper's batch size is its buffers' length
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                attn.workspace.float_ws, attn.kv_layout, use_cuda_graph=True, backend="fa2",
                qo_indptr_buf=self._qo_indptr[: size + 1],
                paged_kv_indptr_buf=self._kv_indptr[: size + 1],
                paged_kv_indices_buf=self._page_ids,
                paged_kv_last_page_len_buf=self._last_page_len[:size],
            )
            self._wrappers[size] = attn.workspace.share(wrapper)

    def plan(self, size: int, rows: Sequence[int], kv_lens: Sequence[int],
             q_lens: Sequence[int]) -> None:
        """Plan a step for the graph of `size` rows: its requests' page-table rows, KV
        lengths (with the step's tokens) and query lengths (the tokens they add, in the
        step's row order). Call before capturing that size and before every replay; the
        backend's `run` then attends through this plan (until the next plan)."""
        pad = size - len(rows)
        assert pad >= 0 and sum(q_lens) <= size, (len(rows), sum(q_lens), size)
        attn = self.attn
        with attn.workspace.planning():
            kv_indptr, last = gather_pages(self.page_table, [*rows, *[-1] * pad],
                                           [*kv_lens, *[1] * pad], attn.page_size,
                                           self.dummy_page, self._gathered)
            qo_indptr = np.zeros(size + 1, dtype=np.int32)
            np.cumsum(np.asarray([*q_lens, *[0] * pad]), out=qo_indptr[1:])
            wrapper = self._wrappers[size]
            wrapper.plan(
                torch.from_numpy(qo_indptr), torch.from_numpy(kv_indptr),
                self._gathered[: int(kv_indptr[-1])], torch.from_numpy(last),
                attn.num_qo_heads, attn.num_kv_heads, attn.head_dim, attn.page_size,
                causal=True, sm_scale=attn.sm_scale, q_data_type=attn.dtype,
                kv_data_type=attn.kv_dtype, disable_split_kv=True,
            )
        attn.activate(wrapper)
