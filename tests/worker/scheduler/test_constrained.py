"""Constrained requests in the scheduler, on the default model (its tokenizer.json feeds the
grammars): outputs match their constraint, share batches with unconstrained requests without
changing those, and give the same tokens with overlap scheduling forced on (their masks then
filled ahead on the helper thread, constrain/prefetch.py) as without."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.core import RouteKind
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import Constraint, ConstraintKind, ErrorCode, Generate, SamplingParams
from minisgl_worker.scheduler import Scheduler
from minisgl_worker.scheduler.report import check_invariants
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


def _spellers(tokenizer: Tokenizer, pattern: str, max_new_tokens: int) -> list[Generate]:
    """Requests 0 and 1, each seeded, sampled under the regex `pattern`."""
    words = Constraint(ConstraintKind.REGEX, pattern)
    return [Generate(rid, _prompt(tokenizer, "Spell a long word."),
                     SamplingParams(temperature=1.0, seed=rid, max_new_tokens=max_new_tokens,
                                    constraint=words)) for rid in range(2)]


def test_constrained_and_free_requests_share_batches(engine_factory: Any, folder: Path) -> None:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    msgs = _requests(tokenizer)
    results, prefetched = [], []
    for overlap in (False, True):
        sched = Scheduler(engine_factory(folder, kv_tokens=2048), overlap=overlap)
        start = sched.masks_ahead.start

        def counted(*args: Any, start: Any = start) -> bool:  # masks filled ahead, how often
            started = start(*args)
            prefetched.append(started)
            return started

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


def test_a_constraint_that_does_not_compile_is_an_invalid_constraint(
    engine_factory: Any, folder: Path
) -> None:
    sched = Scheduler(engine_factory(folder, kv_tokens=256))
    bad = SamplingParams(constraint=Constraint(ConstraintKind.JSON_SCHEMA, '{"type": 3}'))
    error = sched.add_request(Generate(1, [1, 2, 3], bad))
    assert error is not None and error.code is ErrorCode.INVALID_CONSTRAINT
    assert error.message.startswith("json_schema constraint:"), error.message
    assert not sched.has_work


def test_an_abort_of_a_request_planned_ahead_ends_it_at_once(
    engine_factory: Any, folder: Path
) -> None:
    """Under overlap a step of grammar rows alone plans the next batch before it samples
    (scheduler.py); an abort of a request in that planned batch ends it at once: nothing of
    it comes out after the abort (the token in flight is dropped), everything it held is
    free once the planned batch has run, and the other request goes on. Shutting the
    scheduler down ends the masks' helper thread."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    msgs = _spellers(tokenizer, "[a-z]{30,40}", max_new_tokens=50)
    sched = Scheduler(engine_factory(folder, kv_tokens=2048), overlap=True)
    for m in msgs:
        assert sched.add_request(m) is None
    outs: dict[int, list[Any]] = {0: [], 1: []}
    while sched._next is None:  # the first steps prefill; then decodes are planned ahead
        for o in sched.step():
            outs[o.rid].append(o)
    assert 0 in {r.rid for r in sched._next.reqs}
    sched.abort(0)
    assert 0 not in sched.reqs  # gone, though planned into the batch launched next
    check_invariants(sched)
    rest = run(sched, [])
    assert 0 not in rest, rest[0]  # not even the token that was in flight
    text = tokenizer.decode(tokens(outs[1] + rest[1]))
    assert re.fullmatch("[a-z]{30,40}", text) and rest[1][-1].finish == "stop", text
    assert_all_free(sched)
    helpers = [t for t in threading.enumerate() if t.name.startswith("grammar-masks")]
    sched.shutdown()  # its helper thread, started by the steps above, ends
    assert sum(t.is_alive() for t in helpers) < len(helpers), helpers


def test_grammar_rows_alone_queue_each_forward_before_they_wait_for_tokens(
    engine_factory: Any, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under overlap a step of grammar rows alone queues batch N+1's forward before it waits
    for batch N's tokens (its masks need them, its forward does not), so the GPU runs N+1
    while the host moves the matchers and fills the masks (scheduler.py)."""
    from minisgl_worker.engine import engine as engine_module

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    msgs = _spellers(tokenizer, "[a-z]{20,30}", max_new_tokens=40)
    sched = Scheduler(engine_factory(folder, kv_tokens=2048), overlap=True)
    forwards = 0  # forwards queued so far
    waited: list[tuple[Any, int]] = []  # each output waited for, first time: forwards by then

    def counted(*args: Any, run_: Any = sched.engine.runners[RouteKind.EAGER].run) -> Any:
        nonlocal forwards
        forwards += 1
        return run_(*args)

    def tokens_of(out: Any, real: Any = engine_module.ForwardOutput.tokens) -> list[int]:
        if all(o is not out for o, _ in waited):
            waited.append((out, forwards))  # holds `out`: ids stay distinct
        return real(out)

    monkeypatch.setattr(sched.engine.runners[RouteKind.EAGER], "run", counted)
    monkeypatch.setattr(engine_module.ForwardOutput, "tokens", tokens_of)
    outs = run(sched, msgs)
    assert all(o[-1].finish == "stop" for o in outs.values()), outs
    # The k-th batch's tokens (k from 1) were waited for once batch k+1 was queued.
    counts = [n for _, n in waited]
    assert len(counts) > 8 and counts[:-1] == list(range(2, len(counts) + 1)), counts
    assert_all_free(sched)
    sched.shutdown()


def test_grammar_rows_take_every_step_beside_unconstrained_decodes(
    engine_factory: Any, folder: Path
) -> None:
    """Under overlap a grammar row's newest token reaches the host only after the next batch's
    forward is queued: that batch's sampling waits for it (scheduler.py), so grammar rows
    and unconstrained decodes take every step together, the grammar rows' masks filled
    ahead on the helper thread (none by the sampler on the spot but the first). The tokens
    are those of overlap off."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    words = Constraint(ConstraintKind.REGEX, "[a-z]{30,40}")
    msgs = [Generate(0, _prompt(tokenizer, "Count to ten."),
                     SamplingParams(max_new_tokens=16, ignore_eos=True)),
            Generate(1, _prompt(tokenizer, "Spell a long word."),
                     SamplingParams(temperature=1.0, seed=1, max_new_tokens=50,
                                    constraint=words))]
    results = []
    for overlap in (False, True):
        sched = Scheduler(engine_factory(folder, kv_tokens=2048), overlap=overlap)
        batches: list[set[int]] = []  # each batch's sampling rids
        on_the_spot: list[int] = []  # grammar rows the sampler filled itself, per batch
        forward, prepare = sched.engine.forward_batch, sched.engine.sampler._masks.prepare

        def recorded(batch: Any, *args: Any, forward: Any = forward,
                     batches: list[set[int]] = batches) -> Any:
            batches.append({r.rid for r in batch.sample_reqs})
            return forward(batch, *args)

        def counted(*args: Any, prepare: Any = prepare, on_the_spot: list[int] = on_the_spot,
                    ) -> Any:
            job = prepare(*args)
            on_the_spot.append(len(job.missing))
            return job

        sched.engine.forward_batch = recorded  # type: ignore[method-assign]
        sched.engine.sampler._masks.prepare = counted  # type: ignore[method-assign]
        outs = run(sched, msgs)
        results.append({rid: tokens(o) for rid, o in outs.items()})
        assert_all_free(sched)
        sched.shutdown()
    assert results[0] == results[1]
    text = tokenizer.decode(results[1][1])
    assert len(results[1][0]) == 16 and re.fullmatch("[a-z]{30,40}", text), text
    assert len(results[1][1]) > 16  # it outlasts rid 0
    assert batches[1:16] == [{0, 1}] * 15, batches  # rid 0 ends with the 16th token
    # Then alone, every step (the last one's token dropped: its grammar had ended).
    assert batches[16:] == [{1}] * (len(results[1][1]) - 16 + 1), batches
    # Only the first token's mask (sampled by the prefill) was the sampler's to fill.
    assert on_the_spot[0] == 1 and not any(on_the_spot[1:]), on_the_spot


def _held_compiles(sched: Scheduler) -> threading.Event:
    """Holds every off-loop grammar compile of `sched` until the returned event is set."""
    release = threading.Event()
    compile_ = sched.grammars._compile

    def held(constraint: Constraint) -> Any:
        assert release.wait(60), "the test never released the compile"
        return compile_(constraint)

    sched.grammars._compile = held  # type: ignore[method-assign]
    return release


def _wait_compiled(sched: Scheduler, rid: int) -> None:
    """Waits (a minute at most) until rid's compile is done, as the loop finds it."""
    for _ in range(6000):
        if rid in sched.compiling.done():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"rid {rid}'s grammar never compiled")


def _compiled(sched: Scheduler, rid: int) -> None:
    """Waits until rid's compile is done and hands it to the scheduler, as the loop does."""
    _wait_compiled(sched, rid)
    assert sched.grammar_compiled(rid) is None


def test_a_grammar_compiling_off_the_loop_does_not_hold_the_others(
    engine_factory: Any, folder: Path
) -> None:
    """Serving (compile_now False), a grammar the cache lacks compiles on a helper thread:
    the request waits held but unqueued while the others run to their end; once compiled it
    runs as it would have. A second request with the same grammar shares the compile."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    free, regex, _, _ = _requests(tokenizer)
    twin = Generate(5, regex.input_ids, regex.sampling)
    want = run(Scheduler(engine_factory(folder, kv_tokens=2048)), [free, regex])
    sched = Scheduler(engine_factory(folder, kv_tokens=2048))
    release = _held_compiles(sched)
    for msg in (free, regex, twin):
        assert sched.add_request(msg, compile_now=False) is None
    assert len(sched.compiling) == 2 and not sched.only_compiling
    outs: dict[int, list[Any]] = {}
    while free.rid in sched.reqs:
        for o in sched.step():
            outs.setdefault(o.rid, []).append(o)
        check_invariants(sched)
    assert set(outs) == {free.rid} and tokens(outs[free.rid]) == tokens(want[free.rid])
    assert sched.only_compiling and sched.compiling.done() == []
    release.set()
    _compiled(sched, regex.rid)
    assert sched.grammars.num_compiled == 1 and sched.compiling.done() == [twin.rid]
    _compiled(sched, twin.rid)
    while sched.has_work:
        for o in sched.step():
            outs.setdefault(o.rid, []).append(o)
    assert tokens(outs[regex.rid]) == tokens(outs[twin.rid]) == tokens(want[regex.rid])
    assert_all_free(sched)
    sched.shutdown()


def test_a_grammar_that_fails_off_the_loop_ends_its_request_and_an_abort_forgets_one(
    engine_factory: Any, folder: Path
) -> None:
    sched = Scheduler(engine_factory(folder, kv_tokens=256))
    release = _held_compiles(sched)
    bad = SamplingParams(constraint=Constraint(ConstraintKind.JSON_SCHEMA, '{"type": 3}'))
    good = SamplingParams(constraint=Constraint(ConstraintKind.REGEX, "[a-z]+"))
    assert sched.add_request(Generate(1, [1, 2, 3], bad), compile_now=False) is None
    assert sched.add_request(Generate(2, [1, 2, 3], good), compile_now=False) is None
    assert sched.add_request(Generate(3, [1, 2, 3], good), compile_now=False) is None
    sched.abort(2)
    assert sched.grammars.num_compiling == 2  # rid 3 still waits for the same compile
    sched.abort(3)
    assert list(sched.reqs) == [1] and len(sched.compiling) == 1
    assert sched.grammars.num_compiling == 1  # no one waits for it: dropped
    check_invariants(sched)
    release.set()
    _wait_compiled(sched, 1)
    error = sched.grammar_compiled(1)
    assert error is not None and error.code is ErrorCode.INVALID_CONSTRAINT
    assert error.message.startswith("json_schema constraint:"), error.message
    assert sched.grammar_compiled(2) is None  # aborted meanwhile: nothing to do
    assert sched.grammars.num_compiling == 0
    assert not sched.has_work
    assert_all_free(sched)
    sched.shutdown()


def test_a_grammar_engine_that_raises_fails_its_request_not_the_worker(
    engine_factory: Any, folder: Path
) -> None:
    sched = Scheduler(engine_factory(folder, kv_tokens=256))

    def broken(constraint: Constraint) -> Any:
        raise RuntimeError("engine bug")

    sched.grammars._compile = broken  # type: ignore[method-assign]
    good = SamplingParams(constraint=Constraint(ConstraintKind.REGEX, "[a-z]+"))
    assert sched.add_request(Generate(1, [1, 2, 3], good), compile_now=False) is None
    _wait_compiled(sched, 1)
    error = sched.grammar_compiled(1)
    assert error is not None and error.code is ErrorCode.INTERNAL, error
    assert "engine bug" in error.message
    assert not sched.has_work
    assert_all_free(sched)
    sched.shutdown()
