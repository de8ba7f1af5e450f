"""A batch's grammar masks, filled on a helper thread while the scheduler does other work.

Under overlap scheduling a constrained request's mask for step N+1 needs its token from
step N, so it cannot be filled before N's tokens reach the host. On the scheduler's thread
the fill (llguidance: ~20 us a row at a state it has not seen; 64 rows ~1.3 ms, on one
thread: the rows share their grammar's caches: mask.FILL_THREADS), N+1's launch and the
planning of step N+2 would run one after the other while the GPU waits for N+1's sampling.
`MaskPrefetch.start` runs the fill on a helper thread instead (llguidance releases the GIL),
and the sampler takes the masks when it needs them (scheduler.py): the fill runs while the
scheduler processes N and plans N+2, N+1's forward queued already. (On the H200 host the
64-row fill of benches/structured.py took ~1.4 ms beside the launch and the planning, on
mask.FILL_THREADS threads.)

The helper only reads the matchers, and only until the scheduler joins it: nothing moves
them meanwhile (they move when the scheduler processes a batch's tokens). What the fill
does in Python (the rows, the pinned buffer) runs on the scheduler's thread in `start`:
the helper calls llguidance and nothing else, so it takes the GIL twice a step, briefly.

The helper needs the GIL for the few microseconds before llguidance releases it, and Python
hands the GIL from a busy thread to a waiting one only every switch interval (5 ms by
default): the helper would start after the planning, not beside it. While a fill is
pending the interval is SWITCH_S (measured with 1.5 ms of busy Python on the other thread:
on the H200 host the helper started after 1.5 ms at 5 ms, after 0.24 ms at 0.1 ms:
benches/kernels/mask_fill.py).
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .mask import MaskFiller, MaskJob, ReadyMasks
from .matcher import RequestMatcher

SWITCH_S = 1e-4  # the GIL's switch interval while a fill is pending


class MaskPrefetch:
    """One helper thread per scheduler; at most one fill in flight (the scheduler joins each
    before it starts the next)."""

    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._filler = MaskFiller(pin=device.type == "cuda")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._pending: Future[None] | None = None
        self._job: MaskJob | None = None
        self._interval = sys.getswitchinterval()

    def start(self, rows: list[RequestMatcher | None]) -> bool:
        """Starts filling the masks of a batch's rows' live grammars, in their order (as
        the sampler will ask for them) -> whether there were any (else `join` returns None).
        The Python part runs here; the helper only calls llguidance, which releases the GIL
        at once, so the two threads do not take turns at it."""
        assert self._pending is None, "join the previous fill first"
        job = self._filler.prepare(rows, self.vocab_size)
        if not job.rows:
            return False
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_S)
        self._pending = self._pool.submit(job.compute)
        self._job = job
        return True

    def join(self) -> ReadyMasks | None:
        """The masks of the last `start`, once filled (None if it had none)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            pending.result()
        finally:
            sys.setswitchinterval(self._interval)
        job, self._job = self._job, None
        assert job is not None
        return ReadyMasks({m: (j, m.num_tokens) for j, m in enumerate(job.matchers)},
                          job.bitmask)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
