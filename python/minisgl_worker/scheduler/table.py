from __future__ import annotations

import torch


class TableManager:
    """Request slots: each running request owns one row of the page table
    `(max_running, max_context)`, which maps its token positions to KV slots."""

    def __init__(self, page_table: torch.Tensor) -> None:
        self.page_table = page_table
        self.max_running = page_table.shape[0]
        self._free = list(range(self.max_running - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.max_running - len(self._free)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self) -> int:
        assert self._free, "no free request slot"
        return self._free.pop()

    def free(self, idx: int) -> None:
        assert 0 <= idx < self.max_running and idx not in self._free, f"bad slot free {idx}"
        self._free.append(idx)
