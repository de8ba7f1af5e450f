"""The next step's grammar masks, computed on a helper thread while the scheduler plans it.

Under overlap scheduling a constrained request's mask for step N+1 needs its token from
step N. Filled on the scheduler's thread, the mask costs its whole time between N+1's
forward and its sampling, and the next step's planning waits behind it: on a JSON schema
llguidance takes ~20 us a row at a state it has not seen (64 rows: ~1.3 ms, on one thread:
its matchers share their grammar's caches, so more threads do not help).

`MaskPrefetch.start` hands step N's constrained rows to a helper thread as soon as step N+1's
planning begins. The thread waits for N's tokens (a CUDA event; the GIL is released), takes
each row's token into its matcher, and fills the masks of the rows whose grammar goes on
(llguidance releases the GIL too), while the scheduler's thread plans and launches N+1. The
scheduler joins it before it processes N's tokens (`RequestMatcher.take` then finds each
token taken) and hands the masks to N+1's sampler, which reuses every row whose matcher is
still where the mask was filled and fills the others (requests new to decoding) itself.

Only matchers are touched off the scheduler's thread, and only until the join: requests,
their outputs and the KV stay on the scheduler's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from ..core import ReqStatus
from .mask import MaskFiller, ReadyMasks
from .matcher import RequestMatcher

if TYPE_CHECKING:
    from ..core import Batch
    from ..engine import ForwardOutput


class MaskPrefetch:
    """One helper thread per scheduler; at most one prefetch in flight (the scheduler joins
    each before it starts the next)."""

    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._filler = MaskFiller(pin=device.type == "cuda")
        # The thread's CUDA calls (the event wait, the pinned buffer) go to this device.
        init = None
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            init = lambda: torch.cuda.set_device(index)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks", initializer=init)

    def start(self, batch: Batch, out: ForwardOutput) -> Future[ReadyMasks] | None:
        """Starts on a launched batch's live constrained rows (None: it has none); `out`'s
        tokens are waited for on the helper thread. A request retracted while in flight is
        live: the scheduler takes its token too."""
        live = (ReqStatus.RUNNING, ReqStatus.WAITING)
        matchers = [(i, r.matcher) for i, r in enumerate(batch.sample_reqs)
                    if r.matcher is not None and r.status in live]
        return self._pool.submit(self._run, matchers, out.tokens) if matchers else None

    def _run(self, matchers: list[tuple[int, RequestMatcher]],
             tokens: Callable[[], list[int]]) -> ReadyMasks:
        sampled = tokens()
        live: list[RequestMatcher] = []
        for row, matcher in matchers:
            if not matcher.ended and not matcher.advance(sampled[row]):
                live.append(matcher)
        _, bitmask = self._filler.fill(list(live), self.vocab_size)
        return ReadyMasks({m: (j, m.num_tokens) for j, m in enumerate(live)}, bitmask)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
