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

    @property
    def llmatcher(self) -> llg.LLMatcher:
        """The llguidance matcher, for the batched mask fill (mask.py)."""
        return self._matcher

    @property
    def ended(self) -> bool:
        """The grammar has ended (its request finishes with the token that ended it)."""
        return self._matcher.is_stopped()

    def advance(self, token: int) -> bool:
        """Takes the sampled token -> whether the grammar has ended (nothing but EOS could
        follow, or EOS was taken)."""
        ok = self._matcher.consume_token(token)
        assert ok, f"token {token} was outside the mask: {self._matcher.get_error()}"
        self.num_tokens += 1
        return self._matcher.is_stopped()
