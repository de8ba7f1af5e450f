"""Paged-KV metadata in FlashInfer's CSR layout, built from the page table on its device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..transfer import to_device


class PagedKVMeta(NamedTuple):
    """One batch's attention metadata in FlashInfer's layout (int32)."""

    qo_indptr: torch.Tensor  # (B+1,) host, query rows of request i: [qo_indptr[i], [i+1])
    kv_indptr: torch.Tensor  # (B+1,) host, pages of request i: kv_indices[kv_indptr[i]:...]
    kv_indices: torch.Tensor  # (P,) device, page ids
    kv_last_page_len: torch.Tensor  # (B,) host, tokens in each request's last page, >= 1


def paged_kv_meta(
    page_table: torch.Tensor, rows: Sequence[int], kv_lens: Sequence[int],
    q_lens: Sequence[int], page_size: int,
) -> PagedKVMeta:
    """Metadata for requests at page-table `rows` holding `kv_lens` tokens (their new ones
    included) and extending by `q_lens`. The page table holds a slot (page * page_size +
    offset) per position, so a page's id is the slot of its first position // page_size.

    The page ids are gathered on the table's device from per-request sizes (a few hundred
    numbers cross to it, not one index per page): at page size 1 a batch of 256 x 1024
    tokens has 262k pages, and building their index lists on the host cost ~5 ms a step."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    pages, indptr, last = page_counts(lens, page_size)
    total, device = int(indptr[-1]), page_table.device
    sizes = to_device(np.stack([np.asarray(rows, dtype=np.int64), pages, indptr[:-1]]), device)
    row_t, pages_t, start_t = sizes  # (B,) each
    row_idx = torch.repeat_interleave(row_t, pages_t, output_size=total)  # no sync: sized
    first = torch.repeat_interleave(start_t, pages_t, output_size=total)
    col_idx = (torch.arange(total, device=device) - first) * page_size
    kv_indices = page_table[row_idx, col_idx]
    if page_size > 1:
        kv_indices = kv_indices // page_size
    return PagedKVMeta(
        qo_indptr=_indptr(q_lens),
        kv_indptr=torch.from_numpy(indptr.astype(np.int32)),
        kv_indices=kv_indices.to(torch.int32),
        kv_last_page_len=torch.from_numpy(last.astype(np.int32)),
    )


def page_counts(
    lens: np.ndarray, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests of `lens` tokens (int64) -> (pages each, their CSR indptr (B+1,), tokens in
    each last page (>= 1))."""
    pages = (lens + page_size - 1) // page_size
    indptr = np.zeros(len(pages) + 1, dtype=np.int64)
    np.cumsum(pages, out=indptr[1:])
    return pages, indptr, lens - (pages - 1) * page_size


def gather_pages(page_table: torch.Tensor, rows: Sequence[int], lens: Sequence[int],
                 page_size: int, dummy_page: int, out: torch.Tensor,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The page ids of requests at page-table `rows` (< 0: a padding request, whose pages are
    all `dummy_page`) holding `lens` tokens, written into `out` in CSR order on the table's
    device in one launch (page_ids.py) -> (their indptr (B+1,), tokens in each last page
    (B,)), int32 host arrays."""
    from .page_ids import gather_page_ids  # imports triton: CUDA only

    pages, indptr, last = page_counts(np.asarray(lens, dtype=np.int64), page_size)
    sizes = to_device(np.stack([np.asarray(rows, dtype=np.int64), pages, indptr[:-1]]),
                      page_table.device)
    gather_page_ids(page_table, sizes, page_size, dummy_page, out)
    return indptr.astype(np.int32), last.astype(np.int32)


def _indptr(lens: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0, out=out[1:])
    return out
