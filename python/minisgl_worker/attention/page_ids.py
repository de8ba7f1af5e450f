"""A decode batch's page ids gathered from the page table in one Triton launch (CUDA graphs'
plan, flashinfer_backend.FlashInferBackend.plan_padded).

`paged_kv_meta` builds the same list with torch ops: two repeat_interleaves, an arange, the
table gather, a division and a cast, and then the padding rows' dummy pages and a copy into
the graphs' buffer: ~17 launches of 1-5 us each before every decode step, serialized with
the step's graph on the stream (a torch.profiler trace of the offline workload at step 400).
Here one program per (padded) request writes its page ids straight into the buffer."""

from __future__ import annotations

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


def gather_page_ids(page_table: torch.Tensor, sizes: torch.Tensor, page_size: int,
                    dummy_page: int, out: torch.Tensor) -> None:
    """sizes (3, B) int64 on the table's device: request i (page-table row sizes[0, i], or a
    padding request where that is < 0) gets its sizes[1, i] page ids at out[sizes[2, i]:];
    a padding request's are all `dummy_page`. Stream-ordered, no sync."""
    bs = sizes.shape[1]
    assert page_table.stride(1) == 1 and sizes.shape == (3, bs) and sizes.is_contiguous()
    assert sizes.dtype == torch.int64 and sizes.device == page_table.device == out.device
    if bs:
        _page_ids_kernel[(bs,)](page_table, page_table.stride(0), sizes, out, bs, dummy_page,
                                PAGE=page_size, BLOCK=BLOCK, num_warps=4)
