"""Paged KV storage, the page allocator and prefix caches (`create_prefix_cache`)."""

from __future__ import annotations

from .allocator import PageAllocator
from .base import BasePrefixCache, CacheSizes, PrefixMatch
from .naive import NaiveCache
from .pool import MHAKVPool
from .quant import KV_DTYPES
from .radix import RadixCache

__all__ = [
    "CACHE_KINDS",
    "KV_DTYPES",
    "BasePrefixCache",
    "CacheSizes",
    "MHAKVPool",
    "NaiveCache",
    "PageAllocator",
    "PrefixMatch",
    "RadixCache",
    "create_prefix_cache",
]


CACHE_KINDS = ("radix", "naive")


def create_prefix_cache(kind: str, page_size: int) -> BasePrefixCache:
    if kind == "radix":
        return RadixCache(page_size)
    if kind == "naive":
        return NaiveCache()
    raise ValueError(f"unknown prefix cache {kind!r}; expected one of {CACHE_KINDS}")
