"""Constrained requests get their grammar here. A serving worker compiles a constraint it
has not cached on a helper thread (constrain/grammar.py), and the request waits here, held
(its rid live, abortable) but not yet queued, while the loop steps the others. Rank 0's
loop finds the finished compiles (`done`) and broadcasts them, so that every rank of a TP
group queues the request at the same turn (scheduler/loop.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Literal

import llguidance as llg

from ..constrain import GrammarCache, GrammarError, RequestMatcher
from ..core import Req
from ..protocol import Error, ErrorCode

logger = logging.getLogger(__name__)
Compile = Future[llg.LLMatcher]


class Compiling:
    def __init__(self, grammars: GrammarCache) -> None:
        self.grammars = grammars
        self._reqs: dict[int, tuple[Req, Compile]] = {}  # in arrival order

    def __len__(self) -> int:
        return len(self._reqs)

    def attach(self, req: Req, compile_now: bool) -> bool | Error:
        """Gives the request its matcher if it is constrained -> True when it may be queued
        now, False when it waits here for its compile (its grammar is not cached and not
        `compile_now`), or the error when its constraint does not compile."""
        constraint = req.sampling.constraint
        if constraint is None:
            return True
        cached = self.grammars.cached(constraint)
        if cached is None and not compile_now:
            self._reqs[req.rid] = (req, self.grammars.compile_later(constraint))
            return False
        return self._give(req, lambda: cached or self.grammars.matcher(constraint))

    def done(self) -> list[int]:
        """The rids whose compile has finished (or failed), in arrival order."""
        return [rid for rid, (_, compiled) in self._reqs.items() if compiled.done()]

    def finish(self, rid: int) -> Req | Error | None:
        """The request whose compile finished (waiting for it if it still runs: a TP rank
        behind rank 0), to queue, or its error; None if it no longer waits here (aborted)."""
        taken = self._reqs.pop(rid, None)
        if taken is None:
            return None
        req, compiled = taken
        constraint = req.sampling.constraint
        assert constraint is not None
        given = self._give(req, lambda: self.grammars.matcher_from(constraint, compiled))
        return req if given is True else given

    def discard(self, rid: int) -> bool:
        """Forgets an aborted request -> whether it was waiting here. A compile no other
        request waits for is dropped."""
        taken = self._reqs.pop(rid, None)
        if taken is None:
            return False
        req, compiled = taken
        if req.sampling.constraint is not None and all(
                other is not compiled for _, other in self._reqs.values()):
            self.grammars.forget(req.sampling.constraint, compiled)
        return True

    @staticmethod
    def _give(req: Req, matcher: Callable[[], llg.LLMatcher]) -> Literal[True] | Error:
        try:
            req.matcher = RequestMatcher(matcher())
        except GrammarError as e:
            return Error(req.rid, ErrorCode.INVALID_CONSTRAINT, str(e))
        except Exception as e:  # the grammar engine failed: the request fails, not the worker
            logger.exception("rid %d: compiling its grammar failed", req.rid)
            return Error(req.rid, ErrorCode.INTERNAL, f"compiling the grammar failed: {e!r}")
        return True
