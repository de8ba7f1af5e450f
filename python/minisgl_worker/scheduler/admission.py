"""A `Generate` message checked against what this worker can run and turned into a `Req`.

The router validates requests before they reach a worker; these checks are the worker's own
(a message from another router version, a remote client, a context smaller than the model's
because the KV pool is): each failure is a typed protocol `Error` that names the limit."""

from __future__ import annotations

from ..core import Req
from ..engine import Engine
from ..protocol import Error, ErrorCode, Generate


def admit(msg: Generate, engine: Engine, max_context: int) -> Req | Error:
    """The request (its grammar not yet attached: compiling.py), or the error that says why
    this worker cannot run it."""
    n, vocab = len(msg.input_ids), engine.model_config.vocab_size
    if n == 0:
        return Error(msg.rid, ErrorCode.INVALID_REQUEST, "input_ids is empty")
    if n >= max_context:
        return Error(
            msg.rid,
            ErrorCode.CONTEXT_TOO_LONG,
            f"prompt has {n} tokens but this worker's max_context is {max_context} "
            f"(model context {engine.model_config.max_context}, KV capacity "
            f"{engine.kv_pool.num_slots} tokens): at most {max_context - 1} fit",
        )
    bad = [t for t in msg.input_ids if not 0 <= t < vocab]
    if bad:
        message = f"input_ids has {bad[0]} outside the vocabulary [0, {vocab})"
        return Error(msg.rid, ErrorCode.INVALID_REQUEST, message)
    return Req(msg.rid, msg.input_ids, msg.sampling)

