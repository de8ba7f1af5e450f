"""The CacheManager's queued page-table writes: flushed once a step, and never for a row
that was released before the flush (the next request admitted to that row writes the same
entries, and two writes of one entry in one index_put land in no defined order on CUDA)."""

from __future__ import annotations

import torch
from minisgl_worker.core import Req
from minisgl_worker.kvcache import PageAllocator, RadixCache
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.cache import CacheManager
from minisgl_worker.scheduler.table import TableManager


def setup(page_size: int = 4) -> tuple[torch.Tensor, TableManager, CacheManager]:
    page_table = torch.zeros((2, 64), dtype=torch.int32)
    cache = CacheManager(PageAllocator(16), RadixCache(page_size), page_table, page_size)
    return page_table, TableManager(page_table), cache


def admit(table: TableManager, cache: CacheManager, rid: int, ids: list[int]) -> Req:
    req = Req(rid, ids, SamplingParams())
    req.table_idx = table.allocate()
    cache.admit(req)
    return req


def test_writes_land_at_the_flush() -> None:
    page_table, table, cache = setup()
    req = admit(table, cache, 0, list(range(1, 12)))
    slots = cache.extend(req, 10).tolist()  # a chunk
    req.cached_len = 10
    slots.append(int(cache.extend(req, 11)[0]))  # then one more token, as a decode
    assert page_table.eq(0).all(), "written before the flush"
    cache.flush_table()
    assert page_table[req.table_idx, :11].tolist() == slots
    assert page_table[req.table_idx, 11:].eq(0).all()


def test_a_released_requests_queued_writes_never_land() -> None:
    page_table, table, cache = setup()
    first = admit(table, cache, 0, list(range(1, 30)))
    cache.extend(first, 29)  # queued, not flushed
    cache.release(first)
    table.free(first.table_idx)
    second = admit(table, cache, 1, [7, 8, 9])
    assert second.table_idx == first.table_idx  # the freed row, reused at once
    slots = cache.extend(second, 3).tolist()
    cache.flush_table()
    row = page_table[second.table_idx]
    assert row[:3].tolist() == slots
    assert row[3:].eq(0).all(), "the released request's writes landed"
