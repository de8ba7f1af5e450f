"""Overlap scheduling on the CPU (forced on; CUDA's default): the same tokens as the plain
loop, and aborts/finishes of requests in the batch in flight free everything once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minisgl_worker.core import PENDING_TOKEN
from minisgl_worker.protocol import Generate, SamplingParams
from minisgl_worker.scheduler import Scheduler
from minisgl_worker.scheduler.report import check_invariants

from .test_scheduler import PROMPTS, assert_all_free, run, tokens

PARAMS = [
    SamplingParams(max_new_tokens=1 + 5 * i, temperature=0.0 if i % 2 else 0.9, seed=i,
                   min_new_tokens=i % 3)
    for i in range(len(PROMPTS))
]


def _scheduler(engine_factory: Any, path: Path, overlap: bool, **options: Any) -> Scheduler:
    return Scheduler(engine_factory(path, page_size=4, **options), chunk_size=16,
                     overlap=overlap)


def test_overlap_gives_the_plain_loops_tokens(
    engine_factory: Any, tiny_llama: tuple[Path, Any]
) -> None:
    results = []
    for overlap in (False, True):
        sched = _scheduler(engine_factory, tiny_llama[0], overlap, max_running=4)
        outs = run(sched, [Generate(i, p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS))])
        results.append({rid: (tokens(o), o[-1].finish) for rid, o in outs.items()})
        assert_all_free(sched)
    assert results[0] == results[1]


def test_abort_and_finish_of_the_batch_in_flight_free_once(
    engine_factory: Any, tiny_llama: tuple[Path, Any]
) -> None:
    sched = _scheduler(engine_factory, tiny_llama[0], True, max_running=3)
    long = SamplingParams(max_new_tokens=50, ignore_eos=True)
    for rid, prompt in enumerate(PROMPTS[:5]):
        assert sched.add_request(Generate(rid, prompt, long)) is None
    for _ in range(6):
        sched.step()
        check_invariants(sched)
    in_flight = sched._inflight
    assert in_flight is not None
    pending = [r for r in in_flight[0].sample_reqs if r.output_ids[-1] == PENDING_TOKEN]
    assert pending, "the batch in flight samples for running requests"
    sched.abort(pending[0].rid)  # its slot and pages go back now, its token is dropped
    check_invariants(sched)
    sched.cache.check_integrity()
    outs = run(sched, [])
    assert pending[0].rid not in outs
    assert_all_free(sched)


def test_penalties_count_the_token_still_in_flight(
    engine_factory: Any, tiny_llama: tuple[Path, Any]
) -> None:
    """Under overlap a request's newest token is still on the device when its next token is
    sampled; the penalties must count it as the plain loop does (the immediate repeat is
    what they exist for)."""
    penalties = [{"repetition_penalty": 1.3}, {"presence_penalty": 0.5},
                 {"frequency_penalty": 0.5}]
    msgs = [Generate(i, PROMPTS[i % len(PROMPTS)],
                     SamplingParams(max_new_tokens=20, ignore_eos=True, **penalties[i % 3]))
            for i in range(12)]
    results = []
    for overlap in (False, True):
        sched = _scheduler(engine_factory, tiny_llama[0], overlap, max_running=4)
        results.append({rid: tokens(o) for rid, o in run(sched, msgs).items()})
        assert_all_free(sched)
    assert results[0] == results[1]
