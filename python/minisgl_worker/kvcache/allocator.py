from __future__ import annotations


class PageAllocator:
    """Free list of page ids. Freeing a page twice or one never allocated is a bug: asserted."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        assert self.can_allocate(n), f"asked for {n} pages, {len(self._free)} free"
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            assert not self._is_free[p], f"page {p} freed twice"
            self._is_free[p] = True
            self._free.append(p)
