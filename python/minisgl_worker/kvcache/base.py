"""The prefix-cache interface: what CacheManager needs from NaiveCache and RadixCache.

Units are pages (page-aligned token prefixes): a cache only stores whole pages. A request
that matched a prefix holds a handle; `lock` it while the request runs so eviction cannot
take its pages, `unlock` when it ends. The matched pages are only safe to use while the
handle is locked."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

from .blocks import BlockEvents


class PrefixMatch(NamedTuple):
    handle: Any  # opaque; pass back to lock/unlock
    pages: list[int]  # the cached pages of the longest page-aligned prefix, in order


class CacheSizes(NamedTuple):
    evictable_pages: int  # held by the cache only: `evict` can free them
    protected_pages: int  # held by the cache and locked by running requests


class BasePrefixCache(ABC):
    shares_prefixes = True  # whether match_prefix can ever return pages

    @abstractmethod
    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of token_ids. The returned pages are only safe
        to use once the handle is locked."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the matched pages from eviction."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one `lock`."""

    @abstractmethod
    def insert(self, token_ids: list[int], pages: list[int]) -> list[int]:
        """Offer `pages` (one per page_size tokens of token_ids) to the cache. Returns the
        pages the cache did not keep (it held those token prefixes already): the caller
        frees them. Pages obtained from match_prefix are never returned."""

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Drop at least num_pages unlocked pages if it can; returns them for freeing."""

    @abstractmethod
    def sizes(self) -> CacheSizes: ...

    @abstractmethod
    def pages(self) -> list[int]:
        """Every page the cache holds (for integrity checks: O(cache size))."""

    @abstractmethod
    def drain_events(self) -> BlockEvents:
        """The blocks (blocks.py hashes) stored and removed since the last drain, netted."""

    @abstractmethod
    def block_hashes(self) -> list[int]:
        """The hash of every block the cache holds (a full report for a new router)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Assert the cache's own invariants (O(cache size); tests and debugging)."""
