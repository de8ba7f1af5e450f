"""Prefix sharing through the real Scheduler on the tiny model: requests arriving together
with one long shared prompt compute it once (in-batch sharing), a retracted request's
prefix stays cached, and none of it changes greedy outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.protocol import Generate, SamplingParams, TokenOutput
from minisgl_worker.scheduler import Scheduler
from minisgl_worker.scheduler.report import check_invariants, load

SHARED = [(11 * i) % 250 + 3 for i in range(80)]
PROMPTS = [SHARED + [5 + i, 9, 4 + 2 * i] for i in range(4)]
GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True)


def run_all(sched: Scheduler, prompts: list[list[int]], first_rid: int = 0) -> list[Any]:
    for i, p in enumerate(prompts):
        assert sched.add_request(Generate(first_rid + i, p, GREEDY)) is None
    outs: dict[int, list[TokenOutput]] = {}
    while sched.has_work:
        for o in sched.step():
            outs.setdefault(o.rid, []).append(o)
        check_invariants(sched)
        sched.cache.check_integrity()
    return [outs[first_rid + i] for i in range(len(prompts))]


@pytest.mark.parametrize("page_size", [1, 4])
def test_requests_arriving_together_compute_a_shared_prefix_once(
    engine_factory: Any, tiny_llama: tuple[Path, Any], page_size: int
) -> None:
    engine = engine_factory(tiny_llama[0], page_size=page_size)
    naive = run_all(Scheduler(engine, prefix_cache="naive"), PROMPTS)
    engine = engine_factory(tiny_llama[0], page_size=page_size)
    radix = run_all(Scheduler(engine), PROMPTS)
    assert [[o.token for o in r] for r in radix] == [[o.token for o in r] for r in naive]
    assert [r[0].cached_tokens for r in naive] == [0] * 4
    assert [r[0].cached_tokens for r in radix] == [0, 80, 80, 80]


def test_a_retracted_request_resumes_from_its_cached_prefix(
    engine_factory: Any, tiny_llama: tuple[Path, Any]
) -> None:
    long = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [[(7 * i + 3 * j) % 250 + 3 for j in range(20)] for i in range(3)]
    # 72 tokens of KV: three requests growing to 60 tokens each cannot all fit.
    engine = engine_factory(tiny_llama[0], kv_tokens=72, page_size=2)
    sched = Scheduler(engine)
    matched: list[int] = []
    admit = sched.cache.admit

    def recording_admit(req: Any) -> None:
        admit(req)
        if req.output_ids:  # a retracted request coming back
            matched.append(req.cached_len)

    sched.cache.admit = recording_admit  # type: ignore[method-assign]
    for i, p in enumerate(prompts):
        assert sched.add_request(Generate(i, p, long)) is None
    while sched.has_work:
        sched.step()
        sched.cache.check_integrity()
    assert matched and max(matched) >= 20  # more than its prompt came back from the cache


def test_load_separates_live_kv_from_evictable_cache(
    engine_factory: Any, tiny_llama: tuple[Path, Any]
) -> None:
    sched = Scheduler(engine_factory(tiny_llama[0], kv_tokens=256))
    run_all(sched, PROMPTS[:1])
    now = load(sched)
    # Finished: its prompt and output (all but the last token) stay cached, evictable.
    assert (now.kv_used, now.kv_cached) == (0, len(PROMPTS[0]) + GREEDY.max_new_tokens - 1)
    assert sched.add_request(Generate(9, PROMPTS[1], GREEDY)) is None
    sched.step()
    now = load(sched)
    # Running: the matched prefix is locked (used), the rest of the old entry stays evictable.
    assert now.kv_used == len(PROMPTS[1]) and now.kv_used + now.kv_cached == 256 - (
        sched.allocator.num_free
    )
