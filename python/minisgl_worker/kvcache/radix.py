"""RadixCache: a radix tree of cached token prefixes over the paged KV pool.

Each node holds a run of tokens (`key`, a whole number of pages) and the KV pages that
store them (`pages`, one per page_size tokens); a path from the root spells a cached
prefix. Children are keyed by their first page of tokens, so siblings differ in their
first page and a lookup is one dict probe per node plus one slice comparison. Everything
is page-aligned: a prompt's partial last page is never cached, and a match stops at the
last page boundary where the tokens still agree.

- match_prefix walks down while whole pages agree. When the match ends inside a node, the
  node is split at that page boundary so the match ends exactly on a node: that node is
  the handle. Every node on the path is stamped with a logical clock (LRU).
- lock(handle) adds one reference to the handle and each ancestor; unlock removes it. A
  node's `ref` is the number of locks held at or below it, so a locked node's ancestors
  are locked too and the unlocked nodes form whole subtrees: eviction can always reach
  every unlocked page by peeling leaves.
- insert(ids, pages) walks the same way and hangs the unmatched tail off the last node.
  Where the tree already holds a prefix, the caller's pages for it are duplicates
  (computed twice by concurrent requests) and are handed back to be freed; the tree's own
  pages (those match_prefix gave out) are never handed back.
- evict(n) pops unlocked leaves oldest first from a heap; a leaf longer than what is still
  needed loses only its tail pages, and a parent left childless and unlocked joins the
  heap.

`evictable` / `protected` count the pages of unlocked / locked nodes; they move only when
a node's ref crosses zero, so `sizes()` is O(1).

Every node also holds its pages' block hashes (blocks.py: chained over the whole prefix,
so a split only divides the list), and every page that enters or leaves the tree is
recorded in `events` for the router's index (`drain_events`)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from .base import BasePrefixCache, CacheSizes, PrefixMatch
from .blocks import ROOT_HASH, BlockEvents, CacheEvents, chain_hashes


class _Node:
    __slots__ = ("children", "hashes", "key", "last_access", "pages", "parent", "ref", "uid")
    _uids = itertools.count()

    def __init__(
        self, key: list[int], pages: list[int], hashes: list[int], parent: _Node | None
    ) -> None:
        self.key = key  # tokens, len(pages) * page_size of them
        self.pages = pages
        self.hashes = hashes  # one block hash per page
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}  # by first page of tokens
        self.ref = 0  # locks held at or below this node
        self.last_access = 0
        self.uid = next(self._uids)  # heap tie-break

    def path_pages(self) -> list[int]:
        runs = []
        node: _Node | None = self
        while node is not None:
            runs.append(node.pages)
            node = node.parent
        return [p for run in reversed(runs) for p in run]


class RadixCache(BasePrefixCache):
    def __init__(self, page_size: int) -> None:
        assert page_size >= 1
        self.page_size = page_size
        self.root = _Node([], [], [], None)  # never locked, never evicted
        self.events = CacheEvents()
        self._evictable = 0
        self._protected = 0
        self._clock = 0

    # ---- lookup ----

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """The handle is a node; the pages are only safe to use while it is locked."""
        node, _ = self._walk(token_ids)
        return PrefixMatch(handle=node, pages=node.path_pages())

    def _walk(self, ids: list[int]) -> tuple[_Node, int]:
        """Deepest node whose path is a prefix of ids (splitting a node matched part-way),
        and the number of tokens matched."""
        ps, end = self.page_size, len(ids) - len(ids) % self.page_size
        self._clock += 1
        node, pos = self.root, 0
        while pos < end:
            child = node.children.get(tuple(ids[pos : pos + ps]))
            if child is None:
                break
            child.last_access = self._clock
            n = self._match_len(child.key, ids, pos, end)
            pos += n
            if n < len(child.key):
                return self._split(child, n), pos
            node = child
        return node, pos

    def _match_len(self, key: list[int], ids: list[int], pos: int, end: int) -> int:
        """Tokens of key that agree with ids[pos:end], in whole pages (>= 1 page)."""
        n = min(len(key), end - pos)
        if ids[pos : pos + n] == key[:n]:
            return n
        ps, i = self.page_size, self.page_size  # the first page matched via the dict key
        while i + ps <= n and ids[pos + i : pos + i + ps] == key[i : i + ps]:
            i += ps
        return i

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut node after its first n tokens; returns the new upper part (same ref)."""
        assert node.parent is not None and 0 < n < len(node.key) and n % self.page_size == 0
        ps, cut = self.page_size, n // self.page_size
        upper = _Node(node.key[:n], node.pages[:cut], node.hashes[:cut], node.parent)
        upper.ref, upper.last_access = node.ref, node.last_access
        node.parent.children[tuple(node.key[:ps])] = upper
        node.key, node.pages, node.parent = node.key[n:], node.pages[cut:], upper
        node.hashes = node.hashes[cut:]
        upper.children[tuple(node.key[:ps])] = node
        return upper

    # ---- locking ----

    def lock(self, handle: Any) -> None:
        node: _Node = handle
        while node.parent is not None:
            if node.ref == 0:
                self._evictable -= len(node.pages)
                self._protected += len(node.pages)
            node.ref += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        node: _Node = handle
        while node.parent is not None:
            assert node.ref > 0, "unlock without a matching lock"
            node.ref -= 1
            if node.ref == 0:
                self._evictable += len(node.pages)
                self._protected -= len(node.pages)
            node = node.parent

    # ---- insert / evict ----

    def insert(self, token_ids: list[int], pages: list[int]) -> list[int]:
        ps = self.page_size
        assert len(token_ids) == len(pages) * ps, (len(token_ids), len(pages), ps)
        node, pos = self._walk(token_ids)
        held = node.path_pages()
        duplicates = [mine for mine, cached in zip(pages, held) if mine != cached]
        if pos < len(token_ids):
            parent_hash = node.hashes[-1] if node.hashes else ROOT_HASH
            hashes = chain_hashes(parent_hash, token_ids[pos:], ps)
            self.events.store(hashes)
            leaf = _Node(list(token_ids[pos:]), list(pages[pos // ps :]), hashes, node)
            leaf.last_access = self._clock
            node.children[tuple(leaf.key[:ps])] = leaf
            self._evictable += len(leaf.pages)
        return duplicates

    def evict(self, num_pages: int) -> list[int]:
        if num_pages <= 0:
            return []
        heap = [(n.last_access, n.uid, n) for n in self._nodes() if not n.children and not n.ref]
        heapq.heapify(heap)
        out: list[int] = []
        while heap and len(out) < num_pages:
            _, _, node = heapq.heappop(heap)
            need = num_pages - len(out)
            if len(node.pages) > need:  # keep the leaf's head: the likelier reused part
                out += node.pages[-need:]
                self.events.remove(node.hashes[-need:])
                node.pages, node.key = node.pages[:-need], node.key[: -need * self.page_size]
                node.hashes = node.hashes[:-need]
                self._evictable -= need
                break
            out += node.pages
            self.events.remove(node.hashes)
            self._evictable -= len(node.pages)
            parent = node.parent
            assert parent is not None
            del parent.children[tuple(node.key[: self.page_size])]
            if parent.parent is not None and not parent.children and not parent.ref:
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return out

    # ---- accounting ----

    def sizes(self) -> CacheSizes:
        return CacheSizes(evictable_pages=self._evictable, protected_pages=self._protected)

    def pages(self) -> list[int]:
        return [p for node in self._nodes() for p in node.pages]

    def drain_events(self) -> BlockEvents:
        return self.events.drain()

    def block_hashes(self) -> list[int]:
        return [h for node in self._nodes() for h in node.hashes]

    def _nodes(self) -> list[_Node]:
        """Every node but the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        ps, evictable, protected = self.page_size, 0, 0
        seen: set[int] = set()
        for node in self._nodes():
            parent = node.parent
            assert parent is not None and node.pages, "empty or detached node"
            assert len(node.key) == len(node.pages) * ps, "key and pages disagree"
            parent_hash = parent.hashes[-1] if parent.hashes else ROOT_HASH
            assert node.hashes == chain_hashes(parent_hash, node.key, ps), "stale block hashes"
            assert parent.children.get(tuple(node.key[:ps])) is node, "bad child key"
            assert node.ref >= sum(c.ref for c in node.children.values()) >= 0, "bad ref"
            assert seen.isdisjoint(node.pages), "a page is cached twice"
            seen.update(node.pages)
            if node.ref:
                protected += len(node.pages)
            else:
                evictable += len(node.pages)
        assert self.root.ref == 0
        assert (evictable, protected) == (self._evictable, self._protected), (
            f"counted {evictable}/{protected} pages, tracked {self._evictable}/{self._protected}"
        )
