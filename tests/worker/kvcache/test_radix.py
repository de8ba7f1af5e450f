"""RadixCache on its own: matching at page granularity, splits, locks, LRU eviction."""

from __future__ import annotations

import pytest
from minisgl_worker.kvcache import RadixCache, create_prefix_cache


def pages_for(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


@pytest.mark.parametrize("ps", [1, 4])
def test_match_returns_the_longest_page_aligned_prefix(ps: int) -> None:
    cache = RadixCache(ps)
    ids = list(range(100, 100 + 4 * ps))
    assert cache.insert(ids, pages_for(0, 4)) == []
    assert cache.match_prefix(ids).pages == [0, 1, 2, 3]
    assert cache.match_prefix(ids + [7] * ps).pages == [0, 1, 2, 3]
    # Diverging inside the third page: two whole pages match; a partial page never does.
    assert cache.match_prefix(ids[: 2 * ps] + [1] * ps).pages == [0, 1]
    assert cache.match_prefix(ids[: 3 * ps - 1]).pages == [0, 1]
    assert cache.match_prefix([5] + ids).pages == []
    assert cache.match_prefix(ids[: ps - 1]).pages == []
    cache.check_integrity()
    assert cache.sizes() == (4, 0)


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_hands_back_duplicates_but_never_the_trees_pages(ps: int) -> None:
    cache = RadixCache(ps)
    a = list(range(8 * ps))
    b = a[: 4 * ps] + [999] * (4 * ps)
    assert cache.insert(a, pages_for(0, 8)) == []
    # b shares a's first 4 pages; the caller computed them again in pages 20..23.
    assert cache.insert(b, pages_for(20, 8)) == [20, 21, 22, 23]
    assert cache.match_prefix(b).pages == [0, 1, 2, 3, 24, 25, 26, 27]
    # Offering the tree's own pages back (a request that matched them) frees nothing.
    assert cache.insert(a[: 6 * ps], pages_for(0, 6)) == []
    cache.check_integrity()
    assert sorted(cache.pages()) == [*range(8), *range(24, 28)]
    assert cache.sizes() == (12, 0)


@pytest.mark.parametrize("ps", [1, 4])
def test_locked_paths_are_never_evicted(ps: int) -> None:
    cache = RadixCache(ps)
    a, b = [1] * (3 * ps), [2] * (2 * ps)
    cache.insert(a, pages_for(0, 3))
    cache.insert(b, pages_for(10, 2))
    match = cache.match_prefix(a[: 2 * ps])  # splits a's node: lock covers 2 of 3 pages
    assert match.pages == [0, 1]
    cache.lock(match.handle)
    cache.lock(match.handle)
    assert cache.sizes() == (3, 2)
    cache.check_integrity()
    assert sorted(cache.evict(100)) == [2, 10, 11]
    assert cache.sizes() == (0, 2) and cache.evict(1) == []
    cache.unlock(match.handle)
    assert cache.evict(1) == [] and cache.sizes() == (0, 2)
    cache.unlock(match.handle)
    assert cache.sizes() == (2, 0)
    assert sorted(cache.evict(5)) == [0, 1]
    cache.check_integrity()
    assert cache.pages() == [] and cache.match_prefix(a).pages == []


@pytest.mark.parametrize("ps", [1, 4])
def test_eviction_is_lru_over_leaves_and_trims_a_long_leaf(ps: int) -> None:
    cache = RadixCache(ps)
    shared = [7] * (2 * ps)
    old, new = shared + [1] * (3 * ps), shared + [2] * (3 * ps)
    cache.insert(old, pages_for(0, 5))
    cache.insert(new, [0, 1, 10, 11, 12])
    cache.match_prefix(new)  # touch `new`: `old`'s leaf is the least recently used
    assert cache.evict(2) == [3, 4]  # only the tail of old's leaf goes
    assert cache.match_prefix(old).pages == [0, 1, 2]  # now `new` is the older leaf
    assert cache.evict(2) == [11, 12]
    assert cache.sizes().evictable_pages == 4
    # The shared prefix is a parent: it is trimmed only once both leaves are gone.
    assert cache.evict(3) == [10, 2, 1]
    assert cache.match_prefix(new).pages == [0]
    cache.check_integrity()


def test_a_split_node_keeps_its_lock_count() -> None:
    cache = RadixCache(1)
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    handle = cache.match_prefix([1, 2, 3, 4]).handle
    cache.lock(handle)
    assert cache.match_prefix([1, 2, 9]).pages == [0, 1]  # splits the locked node
    cache.check_integrity()
    assert cache.sizes() == (0, 4) and cache.evict(4) == []
    cache.unlock(handle)
    assert cache.sizes() == (4, 0)
    cache.check_integrity()


def test_factory() -> None:
    assert isinstance(create_prefix_cache("radix", 4), RadixCache)
    assert create_prefix_cache("naive", 4).match_prefix([1, 2]).pages == []
    with pytest.raises(ValueError, match="radix"):
        create_prefix_cache("lru", 1)
