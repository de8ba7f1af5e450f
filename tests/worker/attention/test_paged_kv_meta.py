"""`paged_kv_meta` (FlashInfer's CSR page metadata, built without per-page host work) against
a per-request slicing reference, on random tables, lengths and page sizes (CPU)."""

from __future__ import annotations

import random

import torch
from minisgl_worker.attention.flashinfer_meta import paged_kv_meta


def test_paged_kv_meta_matches_per_request_slices() -> None:
    rng = random.Random(0)
    for page_size in (1, 4, 16):
        table = torch.randint(0, 10_000, (12, 256), dtype=torch.int32)
        rows = rng.sample(range(12), 7)
        kv_lens = [rng.randint(1, 256) for _ in rows]
        q_lens = [rng.randint(1, n) for n in kv_lens]
        meta = paged_kv_meta(table, rows, kv_lens, q_lens, page_size)
        pages = [-(-n // page_size) for n in kv_lens]
        ref = torch.cat([table[r, : p * page_size : page_size] for r, p in zip(rows, pages)])
        assert torch.equal(meta.kv_indices, (ref // page_size).to(torch.int32))
        assert meta.kv_indptr.tolist() == [sum(pages[:i]) for i in range(len(pages) + 1)]
        assert meta.qo_indptr.tolist() == [sum(q_lens[:i]) for i in range(len(q_lens) + 1)]
        last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages)]
        assert meta.kv_last_page_len.tolist() == last
