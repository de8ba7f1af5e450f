"""A `Generate` message checked against what this worker can run and turned into a `Req`.

The router validates requests before they reach a worker; these checks are the worker's own
(a message from another router version, a remote client, a context smaller than the model's
because the KV pool is): each failure is a typed protocol `Error` that names the field and
the limit (`bad_message` for a value of the wrong type, `invalid_request` for one out of
range), so one bad request is refused alone instead of failing the step it would join."""

from __future__ import annotations

import math

from ..core import Req
from ..engine import Engine
from ..protocol import Error, ErrorCode, Generate, SamplingParams, is_int, is_number

_NUMBERS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
            "repetition_penalty")
_INTS = ("top_k", "max_new_tokens", "min_new_tokens", "top_logprobs")
_BOOLS = ("ignore_eos", "logprobs")


def admit(msg: Generate, engine: Engine, max_context: int) -> Req | Error:
    """The request (its grammar not yet attached: compiling.py), or the error that says why
    this worker cannot run it."""
    vocab = engine.model_config.vocab_size
    wrong = _wrong_type(msg)
    if wrong:
        return Error(msg.rid, ErrorCode.BAD_MESSAGE, wrong)
    n = len(msg.input_ids)
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
    out_of_range = _out_of_range(msg, vocab)
    if out_of_range:
        return Error(msg.rid, ErrorCode.INVALID_REQUEST, out_of_range)
    return Req(msg.rid, msg.input_ids, msg.sampling)


def _wrong_type(msg: Generate) -> str | None:
    s = msg.sampling
    checks: list[tuple[str, bool, str]] = [
        ("rid", is_int(msg.rid), "an integer"),
        ("input_ids", isinstance(msg.input_ids, list) and all(map(is_int, msg.input_ids)),
         "a list of integers"),
        ("sampling.seed", s.seed is None or is_int(s.seed), "an integer or nil"),
        ("sampling.stop_token_ids", isinstance(s.stop_token_ids, list)
         and all(map(is_int, s.stop_token_ids)), "a list of integers"),
    ]
    checks += [(f"sampling.{f}", is_number(getattr(s, f)), "a number") for f in _NUMBERS]
    checks += [(f"sampling.{f}", is_int(getattr(s, f)), "an integer") for f in _INTS]
    checks += [(f"sampling.{f}", isinstance(getattr(s, f), bool), "a boolean") for f in _BOOLS]
    for field, ok, what in checks:
        if not ok:
            return f"{field} must be {what}"
    return None


def _out_of_range(msg: Generate, vocab: int) -> str | None:
    s: SamplingParams = msg.sampling
    ids = (("input_ids", msg.input_ids), ("sampling.stop_token_ids", s.stop_token_ids),
           ("sampling.logit_bias", [t for t, _ in s.logit_bias]))
    for field, tokens in ids:
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            return f"{field} has {bad} outside the vocabulary [0, {vocab})"
    for field in _NUMBERS:
        if not math.isfinite(getattr(s, field)):
            return f"sampling.{field} must be finite; got {getattr(s, field)}"
    bad_bias = [b for _, b in s.logit_bias if not math.isfinite(b)]
    if bad_bias:
        return f"sampling.logit_bias biases must be finite; got {bad_bias[0]}"
    if s.constraint is not None and s.min_new_tokens > 0:  # the mask may allow only EOS
        return "sampling.min_new_tokens must be 0 with a constraint (it ends where it may)"
    checks = [
        ("temperature", s.temperature >= 0, ">= 0"),
        ("top_p", 0 < s.top_p <= 1, "in (0, 1]"),
        ("top_k", s.top_k >= -1, ">= -1 (-1 and 0: off)"),
        ("min_p", 0 <= s.min_p < 1, "in [0, 1)"),
        ("repetition_penalty", s.repetition_penalty > 0, "> 0"),
        ("seed", s.seed is None or 0 <= s.seed < 2**64, "in [0, 2^64)"),
        ("max_new_tokens", s.max_new_tokens >= 1, ">= 1"),
        ("min_new_tokens", s.min_new_tokens >= 0, ">= 0"),
        ("top_logprobs", 0 <= s.top_logprobs <= vocab, f"in [0, {vocab}]"),
    ]
    for field, ok, limit in checks:
        if not ok:
            return f"sampling.{field} must be {limit}; got {getattr(s, field)}"
    return None
