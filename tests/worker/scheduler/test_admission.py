"""The worker's own checks of a `Generate`: a value of the wrong type or out of range is
refused alone with an error naming the field (what a remote client or another router
version may send), and the requests beside it run on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.protocol import (
    Constraint,
    ConstraintKind,
    Error,
    ErrorCode,
    Generate,
    SamplingParams,
)
from minisgl_worker.scheduler import Scheduler

from .test_scheduler import assert_all_free, run

GOOD = SamplingParams(max_new_tokens=6, ignore_eos=True)
VOCAB = 256  # the tiny model's

BAD = [  # (what the message changes, its error code, what the error says)
    ({"stop_token_ids": [4_000_000_000], "min_new_tokens": 1}, ErrorCode.INVALID_REQUEST,
     "sampling.stop_token_ids has 4000000000 outside the vocabulary [0, 256)"),
    ({"logit_bias": [(VOCAB, 1.0)]}, ErrorCode.INVALID_REQUEST,
     "sampling.logit_bias has 256 outside the vocabulary [0, 256)"),
    ({"logit_bias": [(-1, 1.0)]}, ErrorCode.INVALID_REQUEST,
     "sampling.logit_bias has -1 outside the vocabulary [0, 256)"),
    ({"logit_bias": [(5, float("nan"))]}, ErrorCode.INVALID_REQUEST,
     "sampling.logit_bias biases must be finite; got nan"),
    ({"top_logprobs": VOCAB + 1, "logprobs": True}, ErrorCode.INVALID_REQUEST,
     "sampling.top_logprobs must be in [0, 256]; got 257"),
    ({"temperature": float("inf")}, ErrorCode.INVALID_REQUEST,
     "sampling.temperature must be finite; got inf"),
    ({"temperature": -0.5}, ErrorCode.INVALID_REQUEST, "sampling.temperature must be >= 0"),
    ({"top_p": 0.0}, ErrorCode.INVALID_REQUEST, "sampling.top_p must be in (0, 1]; got 0.0"),
    ({"min_p": 1.0}, ErrorCode.INVALID_REQUEST, "sampling.min_p must be in [0, 1); got 1.0"),
    ({"top_k": -2}, ErrorCode.INVALID_REQUEST, "sampling.top_k must be >= -1"),
    ({"repetition_penalty": 0.0}, ErrorCode.INVALID_REQUEST,
     "sampling.repetition_penalty must be > 0; got 0.0"),
    ({"seed": 2**64}, ErrorCode.INVALID_REQUEST, "sampling.seed must be in [0, 2^64)"),
    ({"max_new_tokens": 0}, ErrorCode.INVALID_REQUEST, "sampling.max_new_tokens must be >= 1"),
    ({"min_new_tokens": -1}, ErrorCode.INVALID_REQUEST, "sampling.min_new_tokens must be >= 0"),
    # The grammar may allow only EOS where min_new_tokens bans it: no token left to sample.
    ({"constraint": Constraint(ConstraintKind.REGEX, "ab?"), "min_new_tokens": 1},
     ErrorCode.INVALID_REQUEST, "sampling.min_new_tokens must be 0 with a constraint"),
    ({"max_new_tokens": "16"}, ErrorCode.BAD_MESSAGE, "sampling.max_new_tokens must be an integer"),
    ({"seed": 1.5}, ErrorCode.BAD_MESSAGE, "sampling.seed must be an integer or nil"),
    ({"temperature": "1"}, ErrorCode.BAD_MESSAGE, "sampling.temperature must be a number"),
    ({"ignore_eos": 1}, ErrorCode.BAD_MESSAGE, "sampling.ignore_eos must be a boolean"),
    ({"stop_token_ids": None}, ErrorCode.BAD_MESSAGE,
     "sampling.stop_token_ids must be a list of integers"),
]


@pytest.fixture
def sched(engine_factory: Any, tiny_llama: tuple[Path, Any]) -> Scheduler:
    return Scheduler(engine_factory(tiny_llama[0]), chunk_size=8192, policy="fcfs")


@pytest.mark.parametrize(("change", "code", "says"), BAD, ids=[str(b[0]) for b in BAD])
def test_a_bad_value_is_refused_alone_and_the_others_run_on(
        sched: Scheduler, change: dict[str, Any], code: ErrorCode, says: str) -> None:
    assert sched.add_request(Generate(0, [5, 6, 7], GOOD)) is None
    sched.step()  # the good request is running when the bad one comes
    err = sched.add_request(Generate(1, [8, 9], replace(GOOD, **change)))
    assert isinstance(err, Error) and (err.rid, err.code) == (1, code)
    assert err.message.startswith(says), err.message
    outs = run(sched, [])
    assert len(outs[0]) == GOOD.max_new_tokens - 1 and outs[0][-1].finish == "length"
    assert_all_free(sched)


@pytest.mark.parametrize(("input_ids", "says"), [
    ([5, 5.5], "input_ids must be a list of integers"),
    ([5, True], "input_ids must be a list of integers"),
])
def test_input_ids_must_be_integers(sched: Scheduler, input_ids: list[Any], says: str) -> None:
    err = sched.add_request(Generate(0, input_ids, GOOD))
    assert isinstance(err, Error) and err.code is ErrorCode.BAD_MESSAGE and err.message == says
