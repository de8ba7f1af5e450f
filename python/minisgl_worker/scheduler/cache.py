"""CacheManager: a running request's pages. It matches and locks a prefix when a request
is admitted, allocates pages as the request grows (evicting unlocked cache pages when the
free list runs short), writes the page table, offers computed prompt pages to the prefix
cache as prefill progresses (`share_prefix`), and on release offers everything computed,
then frees the rest exactly once.

Invariant: every page is in exactly one place: the free list, the prefix cache, or
`self._pages[rid]` of one running request. A request's pages are `[cache-owned prefix,
locked by it] + [its own pages]`; only the cache frees the first part (`check_integrity`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core import PENDING_TOKEN, Req
from ..kvcache import BasePrefixCache, PageAllocator
from ..protocol import CacheEvents
from ..transfer import to_device_packed


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
        self._prefix: dict[int, tuple[Any, int]] = {}  # rid -> (handle, cache-owned pages)
        self._evict_batch = max(1, allocator.num_pages // 256)
        self._pending: list[tuple[int, int, np.ndarray]] = []  # (row, start, slots)

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

    def extend(self, req: Req, new_len: int) -> np.ndarray:
        """Give the request KV slots for positions [cached_len, new_len); returns them."""
        need = self.pages_needed(req, new_len)
        if need:  # (most decode steps need none)
            short = need - self.allocator.num_free
            if short > 0:  # each evict walks the cache: evict in batches, so rarely
                self.allocator.free(self.prefix_cache.evict(max(short, self._evict_batch)))
            self._pages[req.rid] += self.allocator.allocate(need)
        return self._write_table(req, req.cached_len, new_len)

    def share_prefix(self, req: Req) -> None:
        """Offer the request's computed full pages to the cache so that requests admitted
        from now on reuse them, and move its lock to the longer prefix. Where the cache
        already held some of those tokens (another request computed them concurrently), the
        request switches to the cache's pages and frees its duplicates."""
        handle, num_shared = self._prefix[req.rid]
        full = self._known_full_pages(req)
        if full <= num_shared:
            return
        pages = self._pages[req.rid]
        ids = req.token_slice(0, full * self.page_size)
        not_kept = set(self.prefix_cache.insert(ids, pages[:full]))
        match = self.prefix_cache.match_prefix(ids)
        shared = len(match.pages)
        assert shared >= num_shared and not_kept.issuperset(pages[shared:full])
        self.prefix_cache.lock(match.handle)
        self.prefix_cache.unlock(handle)
        self._prefix[req.rid] = (match.handle, shared)
        duplicates = [p for p in pages[num_shared:shared] if p in not_kept]
        if duplicates:
            self.allocator.free(duplicates)
            pages[:shared] = match.pages
            self._write_table(req, 0, shared * self.page_size)

    def release(self, req: Req) -> None:
        """Give back every page the request holds: its computed full pages go to the cache
        (finished, aborted or retracted alike: their KV is valid), the rest to the free
        list. Called exactly once per admission (asserted by the pop)."""
        pages = self._pages.pop(req.rid)
        handle, num_shared = self._prefix.pop(req.rid)
        full = self._known_full_pages(req)
        if full > num_shared:
            ids = req.token_slice(0, full * self.page_size)
            not_kept = self.prefix_cache.insert(ids, pages[:full])
        else:
            full, not_kept = num_shared, []
        self.prefix_cache.unlock(handle)
        self.allocator.free(not_kept + pages[full:])
        # Its unflushed table writes must not land: the row goes to the next admitted
        # request, whose own writes to the same entries would race them in one index_put.
        self._pending = [w for w in self._pending if w[0] != req.table_idx]

    def _known_full_pages(self, req: Req) -> int:
        """Full pages of computed KV whose tokens are known: under overlap scheduling the
        newest tokens may still be in flight (PENDING_TOKEN), and a cache key needs them."""
        end, out = req.cached_len, req.output_ids
        if out and out[-1] == PENDING_TOKEN:
            first = len(out) - 1
            while first > 0 and out[first - 1] == PENDING_TOKEN:
                first -= 1
            end = min(end, len(req.input_ids) + first)
        return end // self.page_size

    def events(self) -> CacheEvents | None:
        """The prefix cache's net change since the last call (None: no change), for the
        router's index: one message per scheduler step, sent before the step's tokens."""
        stored, removed = self.prefix_cache.drain_events()
        return CacheEvents(stored, removed) if stored or removed else None

    def snapshot(self) -> CacheEvents:
        """Every block the prefix cache holds, for a router that just connected (its index
        of this worker starts empty); what was not yet reported is included."""
        self.prefix_cache.drain_events()
        return CacheEvents(self.prefix_cache.block_hashes(), [])

    def check_integrity(self) -> None:
        """Every page is free, cached, or owned by one request, exactly once; each request's
        shared prefix is in the cache. O(pool size): for tests and debugging."""
        self.prefix_cache.check_integrity()
        free = self.allocator.free_pages()
        cached = self.prefix_cache.pages()
        owned = [p for rid, pages in self._pages.items() for p in pages[self._prefix[rid][1]:]]
        everything = free + cached + owned
        assert len(everything) == len(set(everything)) == self.allocator.num_pages, (
            f"{len(free)} free + {len(cached)} cached + {len(owned)} owned pages, "
            f"{len(set(everything))} distinct, pool {self.allocator.num_pages}"
        )
        cached_set = set(cached)
        for rid, pages in self._pages.items():
            assert cached_set.issuperset(pages[: self._prefix[rid][1]]), f"rid {rid} prefix"

    def _write_table(self, req: Req, start: int, end: int) -> np.ndarray:
        """Slots of positions [start, end) (int64, host). The page-table write is queued,
        and `flush_table` issues every queued write of a step at once: one small copy per
        request (plus a sync for the pageable list) cost ~100 us each on CUDA, most of a
        decode step at batch 256."""
        ps, pages = self.page_size, self._pages[req.rid]
        if end - start == 1:  # a decode: no numpy temporaries
            slots = np.array([pages[start // ps] * ps + start % ps], dtype=np.int64)
        else:
            pos = np.arange(start, end)
            first = start // ps
            held = np.asarray(pages[first : -(-end // ps)], dtype=np.int64)
            slots = held[pos // ps - first] * ps + pos % ps
        if len(slots):
            self._pending.append((req.table_idx, start, slots))
        return slots

    def flush_table(self) -> None:
        """Write the queued page-table entries (before a forward reads the table): one
        index_put for the step, its indices built with a fixed number of numpy calls."""
        if not self._pending:
            return
        row, start, slots = zip(*self._pending)
        self._pending.clear()
        lens = np.fromiter(map(len, slots), dtype=np.int64, count=len(slots))
        rows = np.repeat(np.asarray(row, dtype=np.int64), lens)
        # column = the write's start + the entry's offset within its write
        first = np.cumsum(lens) - lens  # each write's first entry in the flat arrays
        cols = np.repeat(np.asarray(start, dtype=np.int64) - first, lens) + np.arange(len(rows))
        vals = np.concatenate(slots)
        rows_t, cols_t, vals_t = to_device_packed([rows, cols, vals], self.page_table.device)
        self.page_table[rows_t, cols_t] = vals_t.to(self.page_table.dtype)
