"""One constrained request's position in its grammar, advanced with each sampled token."""

from __future__ import annotations

import llguidance as llg


class RequestMatcher:
    """Wraps a fresh llguidance matcher and counts the tokens it has taken, so the sampler
    can assert the mask it asks for belongs to the request's newest token (under overlap
    scheduling the token may still be in flight: the scheduler waits for it first)."""

    def __init__(self, matcher: llg.LLMatcher) -> None:
        assert not matcher.is_error(), matcher.get_error()
        self._matcher = matcher
        self.num_tokens = 0

    def fill_mask(self, row_address: int, row_bytes: int) -> None:
        """Writes the next-token bitmask (bit t of word t // 32 set: token t allowed) into
        one contiguous host int32 row."""
        self._matcher.unsafe_compute_mask_ptr(row_address, row_bytes)

    def advance(self, token: int) -> bool:
        """Takes the sampled token -> whether the grammar has ended (nothing but EOS could
        follow, or EOS was taken)."""
        ok = self._matcher.consume_token(token)
        assert ok, f"token {token} was outside the mask: {self._matcher.get_error()}"
        self.num_tokens += 1
        return self._matcher.is_stopped()
