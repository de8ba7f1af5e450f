"""Block hashes and cache events: the chain is the documented formula, a radix split
changes no hash, and the cache reports net stores and evictions (the router's index is
rebuilt from these alone)."""

from __future__ import annotations

import hashlib
import struct

from minisgl_worker.kvcache import RadixCache
from minisgl_worker.kvcache.blocks import CacheEvents, chain_hashes


def reference_hashes(ids: list[int], ps: int) -> list[int]:
    """docs/protocol.md's formula, spelled out with struct."""
    out, parent = [], 0
    for start in range(0, len(ids) - len(ids) % ps, ps):
        data = struct.pack("<Q", parent) + struct.pack(f"<{ps}I", *ids[start : start + ps])
        parent = struct.unpack("<Q", hashlib.sha256(data).digest()[:8])[0]
        out.append(parent)
    return out


def test_the_chain_is_the_documented_formula_and_continues_from_a_parent() -> None:
    ids = [1, 2, 300, 70000, 5, 6, 7, 8, 2**32 - 1, 0, 0, 9]
    whole = chain_hashes(0, ids, 4)
    assert whole == reference_hashes(ids, 4)
    assert chain_hashes(whole[0], ids[4:], 4) == whole[1:]
    assert chain_hashes(0, ids[:4] + [1, 1, 1, 1], 4)[0] == whole[0]
    assert len(set(chain_hashes(0, [7] * 8, 1))) == 8  # same token, different prefixes


def test_events_are_netted_between_drains() -> None:
    events = CacheEvents()
    events.store([1, 2, 3])
    events.remove([3])  # stored and gone again: never reported
    assert events.drain() == ([1, 2], [])
    events.remove([1])
    events.store([1])  # evicted and stored again: no change
    events.remove([2])
    events.store([4])
    assert events.drain() == ([4], [2])
    assert events.drain() == ([], [])


def held(cache: RadixCache) -> set[int]:
    return set(cache.block_hashes())


def test_the_radix_cache_reports_what_it_holds_through_splits_and_evictions() -> None:
    ps, mirror = 4, set()

    def sync() -> None:
        stored, removed = cache.drain_events()
        assert mirror.isdisjoint(stored) and mirror.issuperset(removed)
        mirror.update(stored)
        mirror.difference_update(removed)
        assert mirror == held(cache)
        cache.check_integrity()

    cache = RadixCache(ps)
    a = list(range(100, 132))  # 8 pages
    cache.insert(a, list(range(8)))
    sync()
    assert mirror == set(reference_hashes(a, ps))
    before = held(cache)
    b = a[:12] + [5] * 8  # diverges after 3 pages: splits a's node
    cache.insert(b, list(range(20, 25)))
    sync()
    assert before <= held(cache), "a split must keep every stored hash"
    assert mirror == set(reference_hashes(a, ps)) | set(reference_hashes(b, ps))
    cache.insert(a[:16], list(range(4)))  # already held: nothing new
    assert cache.drain_events() == ([], [])
    cache.evict(3)  # the oldest leaf's tail first
    sync()
    cache.evict(100)
    sync()
    assert mirror == set()
