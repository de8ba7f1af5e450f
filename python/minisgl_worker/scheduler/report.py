"""What a scheduler reports of itself: the `load` message the router balances by, and the
page and slot accounting that tests and debug runs check after every step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol import Load

if TYPE_CHECKING:
    from .scheduler import Scheduler


def load(s: Scheduler) -> Load:
    """Requests waiting (queued, or for their grammar) and running, and the KV pool's use."""
    ps, cache = s.page_size, s.cache
    return Load(waiting=len(s.waiting) + len(s.compiling),
                running=len(s.prefilling) + len(s.decode),
                kv_used=cache.num_used_pages * ps,
                kv_cached=cache.prefix_cache.sizes().evictable_pages * ps,
                kv_total=s.allocator.num_pages * ps, prompt_tokens=s.prompt_tokens,
                cached_prompt_tokens=s.cached_prompt_tokens)


def check_invariants(s: Scheduler) -> None:
    """Page and slot accounting; cheap enough for tests and debug runs."""
    running = s.prefilling + s.decode.reqs
    assert len(running) == s.table.num_used, (len(running), s.table.num_used)
    assert len(running) + len(s.waiting) + len(s.compiling) == len(s.reqs)
    if not running:
        sizes = s.cache.prefix_cache.sizes()
        free = s.allocator.num_free + sizes.evictable_pages
        assert sizes.protected_pages == 0 and free == s.allocator.num_pages
