"""When a request ends: the finish reason of a sampled token, and whether a token still in
flight surely ends it (the scheduler then plans no step for it)."""

from __future__ import annotations

from collections.abc import Collection

from ..core import Req


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
