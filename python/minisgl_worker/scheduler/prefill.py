"""PrefillAdder: picks the prefill work of one step under a token budget (chunked prefill).

Requests are taken in order (partially prefilled ones first, then the waiting queue). A new
one is admitted when a request slot is free and its whole prompt fits in the free KV pages;
each gets as many of its remaining prompt tokens as the budget allows, so a prompt longer
than the budget is split across steps, its first chunks sampling nothing.
Admission stops at the first request that gets nothing, so the queue stays FIFO.

In-batch prefix sharing (`defers`): a new request whose next DEFER_TOKENS uncached tokens
are the ones another request starts computing at the same position in this step waits one
step, and then reuses that request's pages from the prefix cache instead of computing
them again (many requests arriving at once with one long system prompt compute it once).
It keeps its place in the queue; requests behind it may still be admitted."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..core import PENDING_TOKEN, Req, ReqStatus
from .cache import CacheManager
from .table import TableManager

DEFER_TOKENS = 64


class PrefillAdder:
    def __init__(
        self, token_budget: int, table: TableManager, cache: CacheManager, reserve_pages: int
    ) -> None:
        self.budget = token_budget
        self.table = table
        self.cache = cache
        self.reserve_pages = reserve_pages  # kept free so running decodes can grow next step
        self.added: list[Req] = []
        self._computing: set[tuple[int, tuple[int, ...]]] = set()  # (start, next tokens)
        self._sharing = cache.prefix_cache.shares_prefixes

    def add_from(self, queue: Iterable[Req]) -> list[np.ndarray]:
        """Admits what fits from `queue` (partial prefills first, then the waiting queue),
        in order -> the new KV slots of each request added."""
        locs = []
        for req in queue:
            if req.output_ids and req.output_ids[-1] == PENDING_TOKEN:
                break  # retracted while its last token was in flight: next step
            if self.defers(req):
                continue  # its prefix is computed in this batch: reuse it next step
            if not self.try_add(req):
                break
            locs.append(self.cache.extend(req, req.device_len))
        return locs

    def defers(self, req: Req) -> bool:
        """Whether a new request should wait a step for a prefix this step computes. False
        once nothing more can be admitted (try_add then ends the step's admissions), so a
        long queue is not scanned."""
        if not self._computing or req.status != ReqStatus.WAITING:
            return False
        if self.budget <= 0 or not self.table.can_allocate():
            return False
        pages = self.cache.prefix_cache.match_prefix(req.all_ids[:-1]).pages
        return self._key(req, len(pages) * self.cache.page_size) in self._computing

    @staticmethod
    def _key(req: Req, start: int) -> tuple[int, tuple[int, ...]]:
        return start, tuple(req.token_slice(start, start + DEFER_TOKENS))

    def try_add(self, req: Req) -> bool:
        """Schedule a chunk of req (sets device_len and its KV slots); False if none fits."""
        if self.budget <= 0:
            return False
        is_new = req.status == ReqStatus.WAITING
        if is_new:
            if not self.table.can_allocate():
                return False
            req.table_idx = self.table.allocate()
            self.cache.admit(req)
        room = self.cache.token_room(req, self.reserve_pages)
        # A new request starts only if its whole prompt fits the pool: partial prefills
        # must come from the token budget, not from memory, or they could fill the pool.
        extend = min(req.remain_len, self.budget, room)
        if extend <= 0 or (is_new and room < req.remain_len):
            if is_new:  # undo the admission; it stays at the head of the queue
                self.cache.release(req)
                self.table.free(req.table_idx)
                req.table_idx, req.cached_len, req.device_len = -1, 0, 0
            return False
        if is_new:
            req.status = ReqStatus.RUNNING
            if not req.output_ids:  # a retracted request keeps its first report
                req.prefix_len = req.cached_len
        if extend >= DEFER_TOKENS and self._sharing:
            self._computing.add(self._key(req, req.cached_len))
        req.device_len = req.cached_len + extend
        self.budget -= extend
        self.added.append(req)
        return True
