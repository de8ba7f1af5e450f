"""Which decoding requests the next batch takes.

A decode whose newest token surely ends it (max_new_tokens, max_context) takes no turn: no
step is wasted on it. A grammar row's mask for its next token needs its newest token on the
host, and under overlap scheduling the rows of batch N only have theirs once N is processed,
after N+1 was launched. Beside unconstrained decodes such a row sits N+1 out, and its mask
is filled on the helper thread from when N is processed until N+2 samples: the
unconstrained rows keep the overlap, the grammar rows take every other step. Grammar rows
alone take every step, and the scheduler then processes N before it launches N+1
(scheduler.py)."""

from __future__ import annotations

from ..core import PENDING_TOKEN, Req
from .finish import surely_done


def next_decodes(decodes: list[Req], overlap: bool, max_context: int) -> list[Req]:
    """The decodes the next batch takes, in order."""
    live = [r for r in decodes if not surely_done(r, max_context)]
    grammars = [r.matcher is not None for r in live]
    if overlap and any(grammars) and not all(grammars):
        live = [r for r in live if not in_flight_grammar(r)]
    return live


def in_flight_grammar(req: Req) -> bool:
    """A grammar row whose newest token is still in flight."""
    return req.matcher is not None and bool(req.output_ids) and req.output_ids[-1] == PENDING_TOKEN
