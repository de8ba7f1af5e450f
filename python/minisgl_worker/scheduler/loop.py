"""The worker's event loop: receive, step the scheduler (which overlaps batch N+1 with
processing batch N on CUDA; see scheduler.py), send one frame with everything the step
produced: the prefix cache's changes first, then the tokens, so that the router's index
holds a request's stored prefix by the time it sees the request end. Idle, it blocks on the
socket until a message arrives or a Load is due, so an idle worker uses no CPU.

In a TP group rank 0 runs `serve` and every other rank `follow`. Each turn rank 0
broadcasts the turn's messages in one collective (what came from the router, plus the
aborts rank 0 decided alone), and every rank applies the same messages in the same order
before the same step: their schedulers stay identical, so they run the same batches (the
engine also broadcasts rank 0's sampled tokens). Only rank 0 sends. A new grammar compiles
off the loop on every rank; rank 0 adds the word that it is done (`GrammarCompiled`) to a
turn's messages, and each rank queues the request then (scheduler/compiling.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..distributed import Communicator
from ..protocol import (
    Abort,
    Error,
    ErrorCode,
    Generate,
    Hello,
    Msg,
    Ready,
    RouterMsg,
    Shutdown,
    Step,
    TokenOutput,
)
from .io import Beat, ZmqIO
from .report import check_invariants, load
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

# Page and slot accounting checked after every step: on in the test suite and in debug runs
# (MINISGL_CHECK_INVARIANTS=1), off in production, where a step should not pay for it.
CHECK_INVARIANTS = os.environ.get("MINISGL_CHECK_INVARIANTS", "") == "1"


@dataclass(frozen=True, slots=True)
class DropPrefixCache:
    """The offline API's order to every rank to empty its prefix cache (never on the wire:
    only broadcast inside a TP group)."""


@dataclass(frozen=True, slots=True)
class GrammarCompiled:
    """Rank 0's word that request `rid`'s grammar compiled (or failed): every rank queues it
    (or ends it) at the same turn (never on the wire: scheduler/compiling.py)."""

    rid: int


# How often an otherwise idle loop looks whether a grammar has compiled.
COMPILE_POLL_S = 0.002
LOAD_INTERVAL_BUSY_S = 0.5
LOAD_INTERVAL_IDLE_S = 1.0


def serve(scheduler: Scheduler, io: ZmqIO, ready: Ready, parent_pid: int | None = None,
          comm: Communicator | None = None) -> None:
    """Run until a Shutdown arrives, or until `parent_pid` is no longer our parent: a router
    that was killed outright cannot send Shutdown, and its workers would hold the GPU on.
    The check runs every loop, which an idle worker still turns at least once a second.

    The router sends Hello first on every connection and gets Ready back. Requests still
    held then came over an earlier connection, whose router has failed them already: they
    are aborted, as they are when a frame finds no router connected. Ready is followed by
    every block the prefix cache holds: the router's index of this worker starts empty."""
    logger.info("listening on %s", io.address)
    beat = Beat(io, load(scheduler))  # io.py: a long step still sends a Load each second
    try:
        _serve(scheduler, io, ready, parent_pid, comm, beat)
    finally:
        beat.close()


def _serve(scheduler: Scheduler, io: ZmqIO, ready: Ready, parent_pid: int | None,
           comm: Communicator | None, beat: Beat) -> None:
    last_load = time.monotonic()
    pending: list[RouterMsg] = []  # aborts decided here, applied with the next turn's msgs
    while True:
        msgs: list[RouterMsg | GrammarCompiled] = list(pending)
        out: list[Msg] = []
        if parent_pid is not None and os.getppid() != parent_pid:
            logger.error("the router (pid %d) is gone: exiting", parent_pid)
            msgs = [Shutdown()]
        else:
            received, errors = io.recv(_wait(scheduler, last_load))
            msgs += received
            msgs += [GrammarCompiled(rid) for rid in scheduler.compiling.done()]
            out += errors
        now = time.monotonic()  # the turn's arrival time for every rank (spf orders by it)
        if comm is not None:
            comm.broadcast_objects([now, msgs])
        if _apply(scheduler, msgs, out, ready, now):
            return
        with beat.step():
            outputs = _step(scheduler, out, fatal=comm is not None)
        events = scheduler.cache.events()
        if events is not None:
            out.append(events)
        if outputs:
            out.append(Step(outputs))
        pending = []
        if not io.send(out):
            logger.warning("aborting %d requests: no router is connected to take their "
                           "tokens", len(scheduler.reqs))
            pending = [Abort(rid) for rid in scheduler.reqs]
        interval = LOAD_INTERVAL_BUSY_S if scheduler.has_work else LOAD_INTERVAL_IDLE_S
        if time.monotonic() - last_load >= interval:
            last_load = time.monotonic()
            beat.last = load(scheduler)
            io.send([beat.last])


def follow(scheduler: Scheduler, comm: Communicator) -> None:
    """A TP rank other than 0: apply rank 0's messages of each turn, step, until Shutdown.
    Errors are rank 0's to send; a failed step or a lost rank 0 raises (the group goes
    down together)."""
    while True:
        now, msgs = comm.broadcast_objects(None)
        if _apply(scheduler, msgs, [], None, now):
            return
        _step(scheduler, [], fatal=True)
        scheduler.cache.events()  # rank 0 reports the cache (the same blocks): drop ours


def _wait(scheduler: Scheduler, last_load: float) -> float:
    """How long to wait for a message: not at all while there is a step to run, a moment
    while only grammars compile, else until the next Load is due."""
    if not scheduler.has_work:
        return _until_load(last_load, LOAD_INTERVAL_IDLE_S)
    return COMPILE_POLL_S if scheduler.only_compiling else 0.0


def _apply(scheduler: Scheduler, msgs: Sequence[RouterMsg | DropPrefixCache | GrammarCompiled],
           out: list[Msg], ready: Ready | None, now: float) -> bool:
    """Apply one turn's messages in order, appending what to send to `out` -> whether a
    Shutdown came. `now`: the turn's time on rank 0, the arrival of its requests."""
    for msg in msgs:
        if isinstance(msg, Shutdown):
            logger.info("shutdown requested")
            return True
        if isinstance(msg, Hello):
            logger.info("a router connected")
            _abort_all(scheduler, "they came over an earlier connection")
            if ready is not None:
                out += [ready, scheduler.cache.snapshot()]
            continue
        if isinstance(msg, DropPrefixCache):
            scheduler.drop_prefix_cache()
            continue
        if isinstance(msg, GrammarCompiled):
            error = scheduler.grammar_compiled(msg.rid)
            out += [error] if error is not None else []
            continue
        error = _handle(scheduler, msg, now)
        if error is not None:
            out.append(error)
    return False


def _abort_all(scheduler: Scheduler, why: str) -> list[int]:
    """Abort every request the scheduler holds -> their rids."""
    rids = list(scheduler.reqs)
    if rids:
        logger.warning("aborting %d requests: %s", len(rids), why)
    for rid in rids:
        scheduler.abort(rid)
    return rids


def _handle(scheduler: Scheduler, msg: Msg, now: float) -> Error | None:
    try:
        if isinstance(msg, Generate):  # a new grammar compiles off the loop
            return scheduler.add_request(msg, compile_now=False, arrival=now)
        if isinstance(msg, Abort):
            scheduler.abort(msg.rid)
            return None
    except Exception as e:  # e.g. a field of the wrong type that decoded anyway
        logger.exception("bad %s", type(msg).__name__)
        rid = getattr(msg, "rid", None)
        return Error(rid, ErrorCode.BAD_MESSAGE, f"bad {msg.TYPE}: {e!r}")
    return Error(None, ErrorCode.BAD_MESSAGE, f"a worker does not accept {msg.TYPE!r} messages")


def _step(scheduler: Scheduler, out: list[Msg], fatal: bool) -> list[TokenOutput]:
    """One scheduler step. A crash fails the requests it held, not the worker, unless
    `fatal` (a TP group: one rank's failure would leave the ranks apart)."""
    try:
        outputs = scheduler.step()
        if CHECK_INVARIANTS:
            check_invariants(scheduler)
        return outputs
    except Exception as e:
        if fatal:
            raise
        logger.exception("step failed")
        for rid in _abort_all(scheduler, "the step failed"):
            out.append(Error(rid, ErrorCode.INTERNAL, f"worker step failed: {e!r}"))
        return []


def _until_load(last_load: float, interval: float) -> float:
    return max(0.0, last_load + interval - time.monotonic())
