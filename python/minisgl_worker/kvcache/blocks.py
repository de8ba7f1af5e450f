"""Block hashes and cache events: how a worker tells the router what its prefix cache holds.

A block is one page of tokens at a page-aligned position of a prefix. Its hash chains the
hash of the block before it (0 for the first block) with its own tokens:

    h_i = u64_le(sha256(u64_le(h_{i-1}) + u32_le(t) for t in block i)[:8])

so a block's hash names the whole prefix up to its end: it does not depend on how the
radix tree happens to split that prefix into nodes (a node split changes no hash), and the
router, which hashes a prompt the same way, finds a worker's cached prefix by looking up
the prompt's hashes in order (docs/protocol.md; router/src/routing/blocks.rs).

`CacheEvents` collects the blocks stored and removed since it was last drained, netted
per block (a block stored and then evicted in one step is never reported), so the router
gets one message per scheduler step with the net change."""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

ROOT_HASH = 0  # the "previous block" of a prefix's first block


def chain_hashes(parent: int, token_ids: list[int], page_size: int) -> list[int]:
    """The hashes of token_ids' whole pages, continuing the chain after `parent`."""
    assert len(token_ids) % page_size == 0, (len(token_ids), page_size)
    data = np.asarray(token_ids, dtype="<u4").tobytes()
    step = 4 * page_size
    out = []
    for start in range(0, len(data), step):
        digest = hashlib.sha256(parent.to_bytes(8, "little") + data[start : start + step])
        parent = int.from_bytes(digest.digest()[:8], "little")
        out.append(parent)
    return out


class BlockEvents(NamedTuple):
    stored: list[int]  # block hashes the cache holds now and did not at the last drain
    removed: list[int]  # block hashes it held at the last drain and holds no more


class CacheEvents:
    """Net block changes since the last `drain` (insertion-ordered dicts as ordered sets).
    A block alternates between stored and removed (the tree holds a prefix at most once),
    so each call either records a change or cancels the opposite one."""

    def __init__(self) -> None:
        self._stored: dict[int, None] = {}
        self._removed: dict[int, None] = {}

    def store(self, hashes: list[int]) -> None:
        for h in hashes:
            if self._removed.pop(h, 0) is None:
                continue  # removed and stored again since the last drain: no net change
            self._stored[h] = None

    def remove(self, hashes: list[int]) -> None:
        for h in hashes:
            if self._stored.pop(h, 0) is None:
                continue  # stored and removed since the last drain: never reported
            self._removed[h] = None

    def drain(self) -> BlockEvents:
        out = BlockEvents(list(self._stored), list(self._removed))
        self._stored.clear()
        self._removed.clear()
        return out
