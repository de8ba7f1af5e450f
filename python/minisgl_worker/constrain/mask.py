"""Next-token bitmasks: filled on the host for the constrained rows of a batch only, in
parallel, and applied to those rows' logits on their device (CPU or GPU) in one pass.

A bitmask row has one bit per token, 32 to an int32 word: bit t % 32 of word t // 32 is set
when token t is allowed. `MaskFiller` hands all the constrained rows of a step to
llguidance's `LLExecutor` at once: it computes the masks on a Rust thread pool with the GIL
released (~0.1 ms a row serially, spread over the host's cores). Rows without a constraint
get no mask and cost nothing; a matcher whose grammar has ended (its request finished while
the batch was in flight under overlap scheduling: its token is dropped) gets none either.
The upload is one copy of R * V / 8 bytes plus the R row indices, from pinned memory on the
side copy stream (transfer.py), so it does not wait for the kernels queued before it.
"""

from __future__ import annotations

import llguidance as llg
import torch

from ..transfer import to_device, upload
from .matcher import RequestMatcher


class MaskFiller:
    """Fills the masks of one step's constrained rows; one per sampler (the executor's
    thread pool is made once)."""

    def __init__(self, pin: bool) -> None:
        """pin: allocate the host masks in pinned memory (CUDA: non-blocking upload)."""
        self.pin = pin
        self._executor: llg.LLExecutor | None = None  # made at the first constrained step

    def fill(self, matchers: list[RequestMatcher | None],
             vocab_size: int) -> tuple[list[int], torch.Tensor]:
        """-> (rows, bitmask): the batch rows whose matcher is live and their (R, ceil(V /
        32)) int32 masks on the host, row j of the mask for batch row rows[j]."""
        rows = [i for i, m in enumerate(matchers) if m is not None and not m.ended]
        words = (vocab_size + 31) // 32
        bitmask = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=self.pin)
        if rows:
            if self._executor is None:
                self._executor = llg.LLExecutor()
            pairs = [(matchers[i].llmatcher, j) for j, i in enumerate(rows)]  # type: ignore[union-attr]
            self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), words * 4,
                                                   len(rows))
        return rows, bitmask


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
