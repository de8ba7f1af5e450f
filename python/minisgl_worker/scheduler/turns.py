"""Which decoding requests the next batch takes, and which batches wait for their masks.

A decode whose newest token surely ends it (max_new_tokens, max_context) takes no turn: no
step is wasted on it. Every other decode takes every step, grammar rows included: under
overlap scheduling a grammar row's mask for its next token needs its newest token, which
reaches the host only after the next batch's forward is queued; the sampling of such a
batch waits for it, while its forward runs (scheduler.py)."""

from __future__ import annotations

from ..core import PENDING_TOKEN, Req
from .finish import surely_done


def next_decodes(decodes: list[Req], max_context: int) -> list[Req]:
    """The decodes the next batch takes, in order."""
    return [r for r in decodes if not surely_done(r, max_context)]


def in_flight_grammar(req: Req) -> bool:
    """A grammar row whose newest token is still in flight."""
    return req.matcher is not None and bool(req.output_ids) and req.output_ids[-1] == PENDING_TOKEN
