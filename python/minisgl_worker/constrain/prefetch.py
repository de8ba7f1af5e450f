"""A batch's grammar masks, filled on a helper thread while the scheduler plans the next.

Under overlap scheduling a constrained request's mask for step N+1 needs its token from
step N, so it cannot be filled before N's tokens reach the host: between N+1's forward and
its sampling. On the scheduler's thread the fill (llguidance: ~20 us a row at a state it has
not seen; 64 rows ~1.3 ms, on one thread: the rows share their grammar's caches, and more
threads did not help) and the planning of step N+2 would then run one after the other while
the GPU waits for N+1's sampling. `MaskPrefetch.start` runs the fill on a helper thread
instead (llguidance releases the GIL), and the scheduler plans N+2 meanwhile
(scheduler.py); the sampler takes the masks when it needs them.

The helper only reads the matchers, and only until the scheduler joins it: nothing moves
them meanwhile (they move when the scheduler processes a batch's tokens).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from .mask import MaskFiller, ReadyMasks

if TYPE_CHECKING:
    from ..core import Req


class MaskPrefetch:
    """One helper thread per scheduler; at most one fill in flight (the scheduler joins each
    before it starts the next)."""

    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._filler = MaskFiller(pin=device.type == "cuda")
        init = None
        if device.type == "cuda":  # the pinned buffer is this device's
            index = torch.cuda.current_device() if device.index is None else device.index
            init = lambda: torch.cuda.set_device(index)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks", initializer=init)

    def start(self, reqs: list[Req]) -> Future[ReadyMasks] | None:
        """Starts filling the masks of the requests' live grammars, in their order (as the
        sampler will ask for them); None if no request has one."""
        matchers = [r.matcher for r in reqs if r.matcher is not None and not r.matcher.ended]
        if not matchers:
            return None
        return self._pool.submit(self._run, matchers)

    def _run(self, matchers: list) -> ReadyMasks:
        _, bitmask = self._filler.fill(matchers, self.vocab_size)
        return ReadyMasks({m: (j, m.num_tokens) for j, m in enumerate(matchers)}, bitmask)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
