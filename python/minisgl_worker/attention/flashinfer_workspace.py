"""The scratch memory FlashInfer's wrappers share (one float and one device int workspace,
given to each through its public `reset_workspace_buffer`), and the order of their plans:
a plan fills a wrapper's pinned host buffer and copies it to the device asynchronously, so
each plan first waits for the previous plan's copy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-KV scratch size
_INT_WORKSPACE_BYTES = 8 << 20  # FlashInfer's own int workspace size


class Workspace:
    """The scratch memory the wrappers share, and the ordering of their plans."""

    def __init__(self, device: torch.device) -> None:
        # Zeroed: FlashInfer requires a zero float workspace on first use.
        self.float_ws = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.int_ws = torch.zeros(_INT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._plan_done = torch.cuda.Event()
        self._plan_done.record()

    def share(self, wrapper: Any) -> Any:
        """Point `wrapper` at the shared workspaces."""
        wrapper.reset_workspace_buffer(self.float_ws, self.int_ws)
        return wrapper

    def own_float_ws(self) -> torch.Tensor:
        """A float workspace of its own, for a wrapper that also keeps its own int one."""
        return torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.int_ws.device)

    @contextmanager
    def planning(self) -> Iterator[None]:
        """Around every plan: wait for the previous plan's host-to-device copy first."""
        self._plan_done.synchronize()
        yield
        self._plan_done.record()
