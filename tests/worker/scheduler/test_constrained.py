"""Constrained requests in the scheduler, on the default model (its tokenizer.json feeds the
grammars): outputs match their constraint, share batches with unconstrained requests without
changing those, and give the same tokens with overlap scheduling forced on (their masks then
filled ahead on the helper thread, constrain/prefetch.py) as without."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import Constraint, ConstraintKind, ErrorCode, Generate, SamplingParams
from minisgl_worker.scheduler import Scheduler
from tokenizers import Tokenizer

from .test_scheduler import assert_all_free, run, tokens

REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["Paris", "London", "Rome"]


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(ensure_default_model())


def _prompt(tokenizer: Tokenizer, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text).ids


def _requests(tokenizer: Tokenizer) -> list[Generate]:
    regex = Constraint(ConstraintKind.REGEX, REGEX)
    choice = Constraint(ConstraintKind.CHOICE, json.dumps(CHOICES))
    free = SamplingParams(max_new_tokens=12)
    return [
        Generate(0, _prompt(tokenizer, "What is the capital of France?"), free),
        Generate(1, _prompt(tokenizer, "Give me a code."),
                 SamplingParams(temperature=1.0, seed=3, max_new_tokens=20, constraint=regex)),
        Generate(2, _prompt(tokenizer, "What is the capital of Italy?"),
                 SamplingParams(max_new_tokens=12, constraint=choice)),
        Generate(3, _prompt(tokenizer, "Name a color."), free),
    ]


def test_constrained_and_free_requests_share_batches(engine_factory: Any, folder: Path) -> None:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    msgs = _requests(tokenizer)
    results, prefetched = [], []
    for overlap in (False, True):
        sched = Scheduler(engine_factory(folder, kv_tokens=2048), overlap=overlap)
        start = sched.masks_ahead.start

        def counted(*args: Any, start: Any = start) -> Any:  # masks filled ahead, how often
            future = start(*args)
            prefetched.append(future is not None)
            return future

        sched.masks_ahead.start = counted  # type: ignore[method-assign]
        outs = run(sched, msgs)
        results.append({rid: (tokens(o), o[-1].finish) for rid, o in outs.items()})
        assert_all_free(sched)
    assert results[0] == results[1]
    # With overlap, the mask of every constrained token but a request's first (sampled by
    # its prefill) was filled ahead.
    assert sum(prefetched) >= len(results[1][1][0]) - 1, prefetched
    text = {rid: tokenizer.decode(ids) for rid, (ids, _) in results[0].items()}
    assert re.fullmatch(REGEX, text[1]) and results[0][1][1] == "stop", text[1]
    assert text[2] in CHOICES and results[0][2][1] == "stop", text[2]
    alone = run(Scheduler(engine_factory(folder, kv_tokens=2048)), [msgs[0], msgs[3]])
    assert {rid: tokens(o) for rid, o in alone.items()} == {
        rid: results[0][rid][0] for rid in (0, 3)}


def test_a_constraint_that_does_not_compile_is_an_invalid_request(
    engine_factory: Any, folder: Path
) -> None:
    sched = Scheduler(engine_factory(folder, kv_tokens=256))
    bad = SamplingParams(constraint=Constraint(ConstraintKind.JSON_SCHEMA, '{"type": 3}'))
    error = sched.add_request(Generate(1, [1, 2, 3], bad))
    assert error is not None and error.code is ErrorCode.INVALID_REQUEST
    assert error.message.startswith("json_schema constraint:"), error.message
    assert not sched.has_work
