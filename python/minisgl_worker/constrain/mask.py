"""Next-token bitmasks: filled on the host for the constrained rows of a batch only, in
parallel, and applied to those rows' logits on their device (CPU or GPU) in one pass.

A bitmask row has one bit per token, 32 to an int32 word: bit t % 32 of word t // 32 is set
when token t is allowed. `MaskFiller` hands all the constrained rows of a step to
llguidance's `LLExecutor` at once: it computes the masks on a Rust thread pool of
FILL_THREADS with the GIL released (~20 us a row at a state it has not seen). Rows without
a constraint get no mask and cost nothing; a matcher whose grammar has ended (its request
finished while the batch was in flight under overlap scheduling: its token is dropped) gets
none either. The upload is one copy of R * V / 8 bytes plus the R row indices, from pinned
memory on the side copy stream (transfer.py), so it does not wait for the kernels queued
before it.
"""

from __future__ import annotations

from typing import NamedTuple

import llguidance as llg
import torch

from ..transfer import to_device, upload
from .matcher import RequestMatcher

# The fill's threads. Rows of one grammar share its caches: on the H200 host 64 rows of
# benches/structured.py's schema, filled beside the scheduler's step, took 1.32, 1.39 and
# 1.48 ms on 1, 2 and 4 threads, 2.08-2.22 ms on llguidance's default (80% of the 16
# cores); two leave room for batches of several grammars.
FILL_THREADS = 2


class ReadyMasks(NamedTuple):
    """Masks filled ahead (prefetch.py): row j of `bitmask` is for the matcher m with
    rows[m] == (j, m.num_tokens when it was filled)."""

    rows: dict[RequestMatcher, tuple[int, int]]
    bitmask: torch.Tensor  # (R, ceil(V / 32)) int32, on the host


class MaskFiller:
    """Fills the masks of one step's constrained rows; one per sampler (the executor's
    thread pool is made once)."""

    def __init__(self, pin: bool) -> None:
        """pin: allocate the host masks in pinned memory (CUDA: non-blocking upload)."""
        self.pin = pin
        self._executor: llg.LLExecutor | None = None  # made at the first constrained step

    def fill(self, matchers: list[RequestMatcher | None], vocab_size: int,
             ready: ReadyMasks | None = None) -> tuple[list[int], torch.Tensor]:
        """-> (rows, bitmask): the batch rows whose matcher is live and their (R, ceil(V /
        32)) int32 masks on the host, row j of the mask for batch row rows[j]. Masks in
        `ready` are reused where the matcher has not moved since; the rest are filled."""
        job = self.prepare(matchers, vocab_size, ready)
        job.compute()
        return job.rows, job.bitmask

    def prepare(self, matchers: list[RequestMatcher | None], vocab_size: int,
                ready: ReadyMasks | None = None) -> MaskJob:
        """`fill` up to llguidance's computation: the Python part (allocation, ready rows
        copied), so that `MaskJob.compute` can run on a thread that barely needs the GIL."""
        rows = [i for i, m in enumerate(matchers) if m is not None and not m.ended]
        live: list[RequestMatcher] = [matchers[i] for i in rows]  # type: ignore[misc]
        found = [_ready_row(ready, m) for m in live]
        if ready is not None and found == list(range(len(ready.rows))):
            return MaskJob(rows, live, ready.bitmask, [], None)  # the same rows, in order
        words = (vocab_size + 31) // 32
        bitmask = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=self.pin)
        reused = [(j, k) for j, k in enumerate(found) if k is not None]
        if reused:
            dst, src = zip(*reused)
            bitmask[list(dst)] = ready.bitmask[list(src)]  # type: ignore[union-attr]
        missing = [(m.llmatcher, j) for j, (m, k) in enumerate(zip(live, found)) if k is None]
        if missing and self._executor is None:
            self._executor = llg.LLExecutor(num_threads=FILL_THREADS)
        return MaskJob(rows, live, bitmask, missing, self._executor)


class MaskJob(NamedTuple):
    """Masks to compute into `bitmask` (MaskFiller.prepare)."""

    rows: list[int]  # the batch rows with a live grammar
    matchers: list[RequestMatcher]  # theirs, in order: row j of bitmask is matchers[j]'s
    bitmask: torch.Tensor
    missing: list[tuple[llg.LLMatcher, int]]  # (matcher, bitmask row) to compute
    executor: llg.LLExecutor | None

    def compute(self) -> None:
        """llguidance fills the missing rows, on its thread pool with the GIL released."""
        if self.missing:
            words = self.bitmask.shape[1]
            self.executor.unsafe_compute_mask_ptr(  # type: ignore[union-attr]
                self.missing, self.bitmask.data_ptr(), words * 4, len(self.rows))


def _ready_row(ready: ReadyMasks | None, matcher: RequestMatcher) -> int | None:
    """The row of `ready` holding the matcher's mask at its current position, if any."""
    if ready is None or matcher not in ready.rows:
        return None
    row, position = ready.rows[matcher]
    return row if position == matcher.num_tokens else None


def fill_bitmask(matchers: list[RequestMatcher | None], vocab_size: int,
                 pin: bool) -> tuple[list[int], torch.Tensor]:
    """One-off MaskFiller(pin).fill (tests, tools)."""
    return MaskFiller(pin).fill(matchers, vocab_size)


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Sets the disallowed tokens' logits to -inf in place, in the given rows of logits
    (B, V) only; bitmask (len(rows), W) from MaskFiller.fill, on the host (uploaded here)."""
    if not rows:
        return
    batch, vocab = logits.shape
    bits = upload(bitmask, logits.device)
    bit = torch.ones(32, dtype=torch.int32, device=logits.device) << torch.arange(
        32, dtype=torch.int32, device=logits.device)  # bit 31: int32's sign bit
    banned = (bits.unsqueeze(-1) & bit).view(len(rows), -1)[:, :vocab] == 0
    if len(rows) == batch:  # rows are 0..B-1 in order (fill lists them ascending)
        logits.masked_fill_(banned, float("-inf"))
        return
    index = to_device(rows, logits.device)
    # logits[index], not index_select: the latter ran 10x slower on CPU (torch 2.x).
    logits.index_copy_(0, index, logits[index].masked_fill_(banned, float("-inf")))
