"""When a request ends: the finish reason of a sampled token, whether a token still in
flight surely ends it (the scheduler then plans no step for it), and its grammar's end."""

from __future__ import annotations

from collections.abc import Collection

from ..core import Req, ReqStatus, first_pending


def finish_reason(req: Req, token: int, num_out: int, eos_ids: Collection[int],
                  max_context: int) -> str | None:
    """"stop", "length" or None for the request's num_out-th token (grammar ends aside)."""
    s = req.sampling
    is_stop = token in s.stop_token_ids or (token in eos_ids and not s.ignore_eos)
    if is_stop and num_out >= s.min_new_tokens:
        return "stop"
    if num_out >= s.max_new_tokens or len(req.input_ids) + num_out >= max_context:
        return "length"
    return None


def surely_done(req: Req, max_context: int) -> bool:
    """Its newest token (maybe pending) ends it whatever it is."""
    return len(req.output_ids) >= req.sampling.max_new_tokens or req.total_len >= max_context


def advance_matchers(reqs: list[Req], tokens: list[int]) -> None:
    """Moves the grammars of the live constrained requests among `reqs` with their sampled
    tokens (reqs[i]'s is tokens[i]) ahead of the rest of their processing, which a mask fill
    for their next tokens need not wait for (scheduler.py); processing then finds them
    moved (RequestMatcher.advance)."""
    for req, token in zip(reqs, tokens):
        if req.matcher is not None and req.status not in (ReqStatus.FINISHED,
                                                          ReqStatus.ABORTED):
            req.matcher.advance(token, first_pending(req.output_ids) + 1)
