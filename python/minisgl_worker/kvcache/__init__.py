"""Paged KV storage, the page allocator and prefix caches (`create_prefix_cache`)."""

from __future__ import annotations

from .allocator import PageAllocator
from .base import BasePrefixCache, CacheSizes, PrefixMatch
from .naive import NaiveCache
from .pool import MHAKVPool

__all__ = [
    "BasePrefixCache",
    "CacheSizes",
    "MHAKVPool",
    "NaiveCache",
    "PageAllocator",
    "PrefixMatch",
    "create_prefix_cache",
]


def create_prefix_cache(kind: str) -> BasePrefixCache:
    if kind == "naive":
        return NaiveCache()
    raise ValueError(f"unknown prefix cache {kind!r} (the radix cache is not built yet)")
