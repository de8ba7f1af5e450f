"""Next-token bitmasks: filled on the host from each constrained request's matcher, applied
to the logits on their device (CPU or GPU) before sampling.

A bitmask row has one bit per token, 32 to an int32 word: bit t % 32 of word t // 32 is set
when token t is allowed. Unconstrained rows of a batch stay all ones (-1), so one masked
fill covers the whole batch. The host fill costs ~0.1 ms a constrained row (llguidance);
the upload is one small copy (V / 8 bytes a row).
"""

from __future__ import annotations

import torch

from ..transfer import upload
from .matcher import RequestMatcher


def fill_bitmask(matchers: list[RequestMatcher | None], vocab_size: int,
                 pin: bool) -> torch.Tensor:
    """(B, ceil(V / 32)) int32 on the host: each matcher's next-token mask, -1 (all
    allowed) where it is None."""
    words = (vocab_size + 31) // 32
    bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32, pin_memory=pin)
    row_bytes = words * 4
    for i, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill_mask(bitmask[i].data_ptr(), row_bytes)
    return bitmask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Sets the disallowed tokens' logits (B, V) to -inf in place; bitmask from
    fill_bitmask, on the host (uploaded here)."""
    batch, vocab = logits.shape
    bits = upload(bitmask, logits.device)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = (bits.unsqueeze(-1) >> shifts) & 1  # (B, W, 32)
    allowed = allowed.view(batch, -1)[:, :vocab]  # (B, V)
    logits.masked_fill_(allowed == 0, float("-inf"))
