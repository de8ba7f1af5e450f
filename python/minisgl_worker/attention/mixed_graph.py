"""Attention for mixed steps (decodes and prompt chunks, in any order) captured whole in a
CUDA graph of a fixed row count (engine/mixed.py): our Triton kernel (triton_decode.py), one
launch, with a plan a graph can replay.

Each request's query tokens are cut into segments of 16 packed rows (tokens x GQA group: a
decode is one segment, an 8-token piece of a chunk another at group 2; see `query_rows` for
groups over 16), and one program per
(segment, KV head) reads the keys that segment sees, without a split, longest first. The grid
holds one slot per graph row, the most segments a step of that many tokens can have; the
slots past a step's segments return at once.

Until 2026-12-02 this ran FA2's prefill kernel in CUDA-graph mode, planned over one request
a row so that its query tile was the same 16 rows: the same work, but FA2 reads the decode
rows ~2-4% slower than this kernel, which starts the longest segments first (RESULTS.md).

A size's plan is refilled before every replay (`plan`): page ids are gathered on the device
(page_ids.py), the segments cross from the host. Rows past the step's tokens (the graph's
padding) are in no segment: their output is stale, as in the piecewise graphs, and nothing
reads it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .flashinfer_backend import gather_pages
from .flashinfer_kernels import FlashInferPagedAttention
from .triton_decode import SegmentAttention


class MixedGraphAttention:
    def __init__(self, attn: FlashInferPagedAttention, page_table: torch.Tensor,
                 sizes: Sequence[int], dummy_page: int, max_pages_per_req: int) -> None:
        """sizes: the graphs' row counts; dummy_page: a page no request owns."""
        self.attn, self.page_table, self.dummy_page = attn, page_table, dummy_page
        max_rows = max(sizes)
        # A step of `size` rows has at most `size` requests, each within max_pages_per_req.
        page_ids = torch.zeros(max_rows * max_pages_per_req, dtype=torch.int32,
                               device=attn.device)
        self.kernel = SegmentAttention(max_rows, max_rows, attn.num_qo_heads,
                                       attn.num_kv_heads, attn.head_dim, attn.page_size,
                                       attn.sm_scale, page_ids, causal=True)

    def plan(self, size: int, rows: Sequence[int], kv_lens: Sequence[int],
             q_lens: Sequence[int]) -> None:
        """Plan a step for the graph of `size` rows: its requests' page-table rows (< 0: a
        request on the dummy page), KV lengths (with the step's tokens) and query lengths
        (the tokens they add, in the step's row order). Call before capturing that size and
        before every replay; the backend's `run` then attends through this plan (until the
        next plan)."""
        assert len(rows) <= size and sum(q_lens) <= size, (len(rows), sum(q_lens), size)
        indptr, _ = gather_pages(self.page_table, rows, kv_lens, self.attn.page_size,
                                 self.dummy_page, self.kernel.indices)
        self.kernel.plan_segments(indptr, np.asarray(kv_lens), np.asarray(q_lens), size)
        self.attn.activate(self.kernel)
