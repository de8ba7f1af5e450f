"""CacheManager: a running request's pages. It matches and locks a prefix when a request
is admitted, allocates pages as the request grows (evicting unlocked cache pages when the
free list runs short), writes the page table, and on release hands finished prefixes to
the prefix cache and frees the rest exactly once.

Invariant: every page is in exactly one place: the free list, the prefix cache, or
`self._pages[rid]` of one running request (a locked prefix is in both the cache and the
request's list, and only the cache frees it)."""

from __future__ import annotations

from typing import Any

import torch

from ..core import Req
from ..kvcache import BasePrefixCache, PageAllocator


class CacheManager:
    def __init__(
        self, allocator: PageAllocator, prefix_cache: BasePrefixCache, page_table: torch.Tensor,
        page_size: int,
    ) -> None:
        self.allocator = allocator
        self.prefix_cache = prefix_cache
        self.page_table = page_table
        self.page_size = page_size
        self._pages: dict[int, list[int]] = {}  # rid -> pages in position order
        self._prefix: dict[int, tuple[Any, int]] = {}  # rid -> (handle, matched pages)

    @property
    def num_available_pages(self) -> int:
        return self.allocator.num_free + self.prefix_cache.sizes().evictable_pages

    @property
    def num_used_pages(self) -> int:
        sizes = self.prefix_cache.sizes()
        return self.allocator.num_pages - self.allocator.num_free - sizes.evictable_pages

    def admit(self, req: Req) -> None:
        """Match and lock the request's cached prefix (needs req.table_idx)."""
        assert req.rid not in self._pages and req.table_idx >= 0
        # Leave at least one prompt token to compute: its logits give the first token.
        match = self.prefix_cache.match_prefix(req.all_ids[:-1])
        self.prefix_cache.lock(match.handle)
        self._pages[req.rid] = list(match.pages)
        self._prefix[req.rid] = (match.handle, len(match.pages))
        req.cached_len = req.device_len = len(match.pages) * self.page_size
        self._write_table(req, 0, req.cached_len)

    def pages_needed(self, req: Req, new_len: int) -> int:
        return max(0, -(-new_len // self.page_size) - len(self._pages[req.rid]))

    def token_room(self, req: Req, reserve_pages: int) -> int:
        """How many more tokens the request could grow by, keeping reserve_pages spare."""
        pages = len(self._pages[req.rid]) + self.num_available_pages - reserve_pages
        return pages * self.page_size - req.cached_len

    def extend(self, req: Req, new_len: int) -> torch.Tensor:
        """Give the request KV slots for positions [cached_len, new_len); returns them."""
        need = self.pages_needed(req, new_len)
        if need > self.allocator.num_free:
            self.allocator.free(self.prefix_cache.evict(need - self.allocator.num_free))
        self._pages[req.rid] += self.allocator.allocate(need)
        return self._write_table(req, req.cached_len, new_len)

    def release(self, req: Req, finished: bool) -> None:
        """Give back every page the request holds; a finished one offers its prefix to the
        cache. Called exactly once per admission (asserted by the pop)."""
        pages = self._pages.pop(req.rid)
        handle, num_prefix = self._prefix.pop(req.rid)
        if finished:
            full = req.cached_len // self.page_size
            ids = req.all_ids[: full * self.page_size]
            to_free = self.prefix_cache.insert(ids, pages[:full]) + pages[full:]
        else:
            to_free = pages[num_prefix:]
        self.prefix_cache.unlock(handle)
        self.allocator.free(to_free)

    def _write_table(self, req: Req, start: int, end: int) -> torch.Tensor:
        device = self.page_table.device
        pos = torch.arange(start, end, device=device)
        pages = torch.tensor(self._pages[req.rid], dtype=torch.long, device=device)
        slots = pages[pos // self.page_size] * self.page_size + pos % self.page_size
        self.page_table[req.table_idx, start:end] = slots.to(self.page_table.dtype)
        return slots
