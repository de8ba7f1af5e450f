"""A decode batch's page ids gathered from the page table in one Triton launch (CUDA graphs'
plan, flashinfer_backend.FlashInferBackend.plan_padded).

`paged_kv_meta` builds the same list with torch ops: two repeat_interleaves, an arange, the
table gather, a division and a cast, and then the padding rows' dummy pages and a copy into
the graphs' buffer: ~17 launches of 1-5 us each before every decode step, serialized with
the step's graph on the stream (a torch.profiler trace of the offline workload at step 400).
Here one program per (padded) request writes its page ids straight into the buffer."""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK = 128  # page ids a program writes per iteration


@triton.jit
def _page_ids_kernel(table_ptr, table_stride, sizes_ptr, out_ptr, bs, dummy_page,
                     PAGE: tl.constexpr, BLOCK: tl.constexpr):
    # sizes: rows (bs), pages (bs), first index in out (bs); a row < 0 is a padding request
    i = tl.program_id(0)
    row = tl.load(sizes_ptr + i)
    pages = tl.load(sizes_ptr + bs + i)
    start = tl.load(sizes_ptr + 2 * bs + i)
    real = row >= 0
    for j0 in range(0, pages, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        valid = j < pages
        # the slot of each page's first position (slot // PAGE is the page id); a padding
        # request reads row 0 and discards it
        slot = tl.load(table_ptr + tl.maximum(row, 0) * table_stride + j * PAGE, mask=valid,
                       other=0)
        page = tl.where(real, slot // PAGE, dummy_page)
        tl.store(out_ptr + start + j, page.to(out_ptr.dtype.element_ty), mask=valid)


def gather_page_ids(page_table: torch.Tensor, rows: np.ndarray, pages: np.ndarray,
                    starts: np.ndarray, page_size: int, dummy_page: int,
                    out: torch.Tensor) -> None:
    """Request i (page-table row rows[i], or a padding request where rows[i] < 0) gets its
    pages[i] page ids at out[starts[i]:]; a padding request's are all `dummy_page`. The host
    arrays cross in one pinned copy. Stream-ordered, no sync."""
    assert page_table.stride(1) == 1 and len(rows) == len(pages) == len(starts)
    sizes = torch.from_numpy(np.stack([rows, pages, starts]).astype(np.int64))
    if out.is_cuda:
        sizes = sizes.pin_memory().to(out.device, non_blocking=True)
    if len(rows):
        _page_ids_kernel[(len(rows),)](page_table, page_table.stride(0), sizes, out, len(rows),
                                       dummy_page, PAGE=page_size, BLOCK=BLOCK, num_warps=4)
