"""Randomized simulation of the KV bookkeeping with no model: requests sharing prefixes
arrive, get admitted (matching the radix cache), prefill in chunks, decode, get retracted,
finish or abort, while the cache is evicted under them. The real RadixCache, CacheManager,
TableManager and PageAllocator do the work; the simulation records which (position, token)
each KV slot was last written with, so a page handed out while still in use, or a cached
page holding the wrong tokens, shows up as a request reading someone else's KV.

After every operation: `check_integrity()` (every page free, cached or owned, exactly once),
the KV each running request reads is its own tokens', and whenever nothing runs,
free + evictable == total."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl_worker.core import Req, ReqStatus
from minisgl_worker.kvcache import PageAllocator, RadixCache
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.cache import CacheManager
from minisgl_worker.scheduler.table import TableManager

PREFIXES = [[1, 2, 3, 4] + [g] * 3 + list(range(20 + g, 36 + g)) for g in range(3)]
OPS = ["arrive", "arrive", "admit", "extend", "extend", "extend", "finish", "abort",
       "retract", "evict", "drop_waiting"]


class Sim:
    def __init__(self, page_size: int, num_pages: int, max_running: int) -> None:
        self.ps = page_size
        self.max_context = num_pages * page_size
        self.page_table = torch.zeros((max_running, self.max_context), dtype=torch.int32)
        self.table = TableManager(self.page_table)
        self.allocator = PageAllocator(num_pages)
        self.radix = RadixCache(page_size)
        self.cache = CacheManager(self.allocator, self.radix, self.page_table, page_size)
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (position, token) last written
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.next_rid = 0
        self.cache_hits = 0

    def arrive(self, a: int, b: int) -> None:
        prefix = PREFIXES[a % len(PREFIXES)][: 1 + b % 23]
        suffix = [(a * 7 + b * i) % 4 for i in range(b % 9)]  # tiny vocab: more sharing
        req = Req(self.next_rid, prefix + suffix, SamplingParams())
        self.next_rid += 1
        self.waiting.append(req)

    def admit(self, a: int, b: int) -> None:
        if not self.waiting or not self.table.can_allocate():
            return
        req = self.waiting.pop(a % len(self.waiting))
        req.table_idx = self.table.allocate()
        self.cache.admit(req)
        self.cache_hits += req.cached_len > 0
        assert req.cached_len < req.total_len  # at least one token left to compute
        if self.cache.token_room(req, 0) < req.remain_len:
            self.cache.release(req)  # does not fit: back to the queue, as PrefillAdder does
            self.table.free(req.table_idx)
            self._reset(req)
            self.waiting.insert(0, req)
            return
        req.status = ReqStatus.RUNNING
        self.running.append(req)

    def extend(self, a: int, b: int) -> None:
        """Compute a chunk (or one decode token) of a running request, then sample if the
        chunk reached its end; with no pages left, retract it (the scheduler's move)."""
        if not self.running:
            return
        req = self.running[a % len(self.running)]
        new_len = min(req.total_len, req.cached_len + 1 + b % 11)
        if self.cache.pages_needed(req, new_len) > self.cache.num_available_pages:
            self.retract(a, b)
            return
        req.device_len = new_len
        slots = self.cache.extend(req, new_len).tolist()
        for pos, slot in zip(range(req.cached_len, new_len), slots):
            self.kv[slot] = (pos, req.token_slice(pos, pos + 1)[0])
        req.cached_len = new_len
        self.cache.share_prefix(req)
        if req.cached_len == req.total_len:
            req.output_ids.append((a + b) % 4)
            if req.total_len >= self.max_context:
                self._end(req)

    def finish(self, a: int, b: int) -> None:
        if self.running:
            self._end(self.running[a % len(self.running)])

    abort = finish  # the same bookkeeping: release what is computed, free the rest once

    def retract(self, a: int, b: int) -> None:
        if self.running:
            req = self.running.pop(a % len(self.running))
            self.cache.release(req)
            self.table.free(req.table_idx)
            self._reset(req)
            self.waiting.insert(0, req)

    def evict(self, a: int, b: int) -> None:
        self.allocator.free(self.radix.evict(b % 6))

    def drop_waiting(self, a: int, b: int) -> None:
        if self.waiting:
            self.waiting.pop(a % len(self.waiting))

    def _end(self, req: Req) -> None:
        self.running.remove(req)
        self.cache.release(req)
        self.table.free(req.table_idx)

    @staticmethod
    def _reset(req: Req) -> None:
        req.status, req.table_idx, req.cached_len, req.device_len = ReqStatus.WAITING, -1, 0, 0

    def check(self) -> None:
        self.cache.flush_table()  # as the scheduler does before a forward reads the table
        self.cache.check_integrity()
        assert self.table.num_used == len(self.running)
        for req in self.running:
            slots = self.page_table[req.table_idx, : req.cached_len].tolist()
            ids = req.all_ids
            assert [self.kv.get(s) for s in slots] == [(p, ids[p]) for p in range(len(slots))]
        sizes = self.radix.sizes()
        if not self.running:
            assert sizes.protected_pages == 0
            assert self.allocator.num_free + sizes.evictable_pages == self.allocator.num_pages


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 99), st.integers(0, 99)),
                 max_size=120),
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(8, 40),
    max_running=st.integers(1, 6),
)
def test_random_traffic_never_leaks_or_shares_a_page_wrongly(
    ops: list[tuple[str, int, int]], page_size: int, num_pages: int, max_running: int
) -> None:
    sim = Sim(page_size, num_pages, max_running)
    for op, a, b in ops:
        getattr(sim, op)(a, b)
        sim.check()
    while sim.running:  # drain: everything ends, the pool is all free or evictable
        sim.finish(0, 0)
        sim.check()
    assert sim.table.num_free == max_running


def test_the_simulation_hits_the_cache() -> None:
    """Guard against a vacuous simulation: shared prefixes are matched."""
    sim = Sim(page_size=2, num_pages=64, max_running=4)
    for i in range(8):
        sim.arrive(i % 2, 22)
        sim.admit(0, 0)
        for _ in range(6):
            sim.extend(len(sim.running) - 1, 10)
            sim.check()
        sim.finish(len(sim.running) - 1, 0)
        sim.check()
    assert sim.cache_hits >= 6
