"""The decode set: running requests whose prompt is done, in admission order. Before each
step every one of them needs a KV slot for its newest token; if the pool cannot give them
all one, the newest are retracted (KV freed, sent back to the waiting queue to be
recomputed later, their output so far kept), which keeps the oldest making progress."""

from __future__ import annotations

from collections.abc import Callable

from ..core import Req
from .cache import CacheManager


class DecodeManager:
    def __init__(self) -> None:
        self.reqs: list[Req] = []

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Req) -> None:
        assert req.is_decoding and req.remain_len == 1
        self.reqs.append(req)

    def remove(self, req: Req) -> None:
        self.reqs.remove(req)

    def pages_needed(self, cache: CacheManager) -> int:
        return sum(cache.pages_needed(r, r.total_len) for r in self.reqs)

    def retract_until_fits(self, cache: CacheManager, retract: Callable[[Req], None]) -> int:
        """Retract (newest first) until the rest fit in the pool; returns how many."""
        count = 0
        while self.reqs and self.pages_needed(cache) > cache.num_available_pages:
            retract(self.reqs.pop())
            count += 1
        return count
