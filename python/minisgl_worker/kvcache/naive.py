from __future__ import annotations

from typing import Any

from .base import BasePrefixCache, CacheSizes, PrefixMatch
from .blocks import BlockEvents


class NaiveCache(BasePrefixCache):
    """Caches nothing: every request computes its whole prompt."""

    shares_prefixes = False

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        return PrefixMatch(handle=None, pages=[])

    def lock(self, handle: Any) -> None:
        assert handle is None

    def unlock(self, handle: Any) -> None:
        assert handle is None

    def insert(self, token_ids: list[int], pages: list[int]) -> list[int]:
        return list(pages)

    def evict(self, num_pages: int) -> list[int]:
        return []

    def sizes(self) -> CacheSizes:
        return CacheSizes(evictable_pages=0, protected_pages=0)

    def pages(self) -> list[int]:
        return []

    def drain_events(self) -> BlockEvents:
        return BlockEvents([], [])

    def block_hashes(self) -> list[int]:
        return []

    def check_integrity(self) -> None:
        pass
