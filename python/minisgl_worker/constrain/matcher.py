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
        # Kept here: a mask fill on llguidance's threads holds the matcher, and the
        # scheduler asks whether it ended meanwhile (scheduler.process_results).
        self._ended = matcher.is_stopped()

    @property
    def llmatcher(self) -> llg.LLMatcher:
        """The llguidance matcher, for the batched mask fill (mask.py)."""
        return self._matcher

    @property
    def ended(self) -> bool:
        """The grammar has ended (its request finishes with the token that ended it)."""
        return self._ended

    def advance(self, token: int, position: int | None = None) -> bool:
        """Takes the sampled token, its request's `position`-th output (1-based; None: the
        next) -> whether the grammar has ended (nothing but EOS could follow, or EOS was
        taken). A matcher already at `position` only answers: under overlap the scheduler
        moves the matchers a mask fill needs before it processes the rest of the batch
        (scheduler.py)."""
        position = self.num_tokens + 1 if position is None else position
        if self.num_tokens == position - 1:
            ok = self._matcher.consume_token(token)
            assert ok, f"token {token} was outside the mask: {self._matcher.get_error()}"
            self.num_tokens += 1
            self._ended = self._matcher.is_stopped()
        assert self.num_tokens == position, (self.num_tokens, position)
        return self._ended
