"""The scheduler with a real engine on the tiny model: batching, chunking, retraction,
stop conditions, errors, and that every page and slot comes back exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.core import ReqStatus
from minisgl_worker.protocol import Error, ErrorCode, Generate, SamplingParams, TokenOutput
from minisgl_worker.scheduler import Scheduler
from minisgl_worker.scheduler.report import check_invariants, load

PROMPTS = [[(13 * i + 7 * j) % 250 + 3 for j in range(5 + 3 * i)] for i in range(6)]
GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


@pytest.fixture
def make_scheduler(engine_factory: Any, tiny_llama: tuple[Path, Any]) -> Iterator[Any]:
    def make(chunk_size: int = 8192, prefix_cache: str = "radix", policy: str = "fcfs",
             mixed_chunk_size: int | None = None, mixed_step_tokens: int | None = None,
             **options: Any) -> Scheduler:
        engine = engine_factory(tiny_llama[0], **options)
        return Scheduler(engine, chunk_size=chunk_size, prefix_cache=prefix_cache,
                         policy=policy, mixed_chunk_size=mixed_chunk_size,
                         mixed_step_tokens=mixed_step_tokens)

    yield make


def run(sched: Scheduler, msgs: list[Generate], steps: int = 10_000) -> dict[int, Any]:
    for m in msgs:
        assert sched.add_request(m) is None
    outs: dict[int, list[TokenOutput]] = {m.rid: [] for m in msgs}
    for _ in range(steps):
        if not sched.has_work:
            break
        for o in sched.step():
            outs.setdefault(o.rid, []).append(o)
        check_invariants(sched)
        sched.cache.check_integrity()
    return outs


def tokens(outs: list[TokenOutput]) -> list[int]:
    return [o.token for o in outs]


def assert_all_free(sched: Scheduler) -> None:
    check_invariants(sched)
    sched.cache.check_integrity()
    sizes = sched.cache.prefix_cache.sizes()
    assert not sched.reqs and sizes.protected_pages == 0
    assert sched.allocator.num_free + sizes.evictable_pages == sched.allocator.num_pages
    assert sched.table.num_free == sched.table.max_running


def test_concurrent_requests_batch_and_match_each_alone(make_scheduler: Any) -> None:
    sched = make_scheduler(page_size=4)
    alone = [tokens(run(sched, [Generate(i, p, GREEDY)])[i]) for i, p in enumerate(PROMPTS)]
    together = run(sched, [Generate(10 + i, p, GREEDY) for i, p in enumerate(PROMPTS)])
    assert [tokens(together[10 + i]) for i in range(len(PROMPTS))] == alone
    assert all(len(t) == 12 and o[-1].finish == "length" for t, o in zip(alone, together.values()))
    assert_all_free(sched)


def test_small_chunks_and_a_small_pool_give_the_same_tokens(
    make_scheduler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ref = run(make_scheduler(), [Generate(i, p, GREEDY) for i, p in enumerate(PROMPTS)])
    # 7-token chunks split every prompt; a 48-token pool cannot hold all six requests, so
    # decodes get retracted and recomputed.
    sched = make_scheduler(chunk_size=7, kv_tokens=48, page_size=2)
    got = run(sched, [Generate(i, p, GREEDY) for i, p in enumerate(PROMPTS)])
    assert {r: tokens(o) for r, o in got.items()} == {r: tokens(o) for r, o in ref.items()}
    assert "retracted" in caplog.text
    assert_all_free(sched)


def test_the_radix_cache_does_not_change_greedy_outputs(make_scheduler: Any) -> None:
    shared = PROMPTS[5][:13]
    prompts = [shared + p[:k] for k, p in zip([0, 1, 4, 7, 9, 3], PROMPTS)] + [shared * 2]
    msgs = [Generate(i, p, GREEDY) for i, p in enumerate(prompts)]
    naive = run(make_scheduler(page_size=2, prefix_cache="naive"), msgs)
    sched = make_scheduler(page_size=2, chunk_size=16)
    first = run(sched, msgs[:1])  # computes and caches the shared prefix
    rest = run(sched, msgs[1:])  # match it; chunks of 16 share it among themselves too
    again = run(sched, [Generate(10 + i, p, GREEDY) for i, p in enumerate(prompts)])
    want = {r: tokens(o) for r, o in naive.items()}
    assert {r: tokens(o) for r, o in {**first, **rest}.items()} == want
    assert {r - 10: tokens(o) for r, o in again.items()} == want
    assert all(o[0].cached_tokens == 0 for o in naive.values())
    assert all(o[0].cached_tokens >= 12 for o in rest.values())  # the shared 13, paged
    assert all(o[0].cached_tokens >= len(p) - 2 for o, p in zip(again.values(), prompts))
    assert_all_free(sched)


def test_new_requests_join_while_others_decode(make_scheduler: Any) -> None:
    sched = make_scheduler()
    assert sched.add_request(Generate(0, PROMPTS[0], GREEDY)) is None
    first = sched.step() + sched.step()
    assert sched.add_request(Generate(1, PROMPTS[1], GREEDY)) is None
    batch = sched.schedule()
    assert batch is not None and batch.phase == "mixed" and batch.size == 2
    sched.process_results(batch, sched.launch(batch))
    assert [o.rid for o in first] == [0, 0]


@pytest.mark.parametrize("policy", ["fcfs", "lof", "spf"])
def test_the_policy_orders_admission(make_scheduler: Any, policy: str) -> None:
    sched = make_scheduler(max_running=2, policy=policy)
    sched.budget.prompt_token_s = 1.0  # spf: a window far wider than the arrivals' gaps
    lengths = [3, 20, 7, 20, 5]
    prompts = [PROMPTS[k] for k in (4, 0, 3, 1, 2)]  # 17, 5, 14, 8 and 11 tokens
    msgs = [Generate(i, prompts[i], SamplingParams(max_new_tokens=n, ignore_eos=True))
            for i, n in enumerate(lengths)]
    first_token_order: list[int] = []
    for m in msgs:
        assert sched.add_request(m) is None
    while sched.has_work:
        first_token_order += [o.rid for o in sched.step() if o.rid not in first_token_order]
    # Two slots: the order in which requests get their first token is the admission order.
    want = {"fcfs": [0, 1, 2, 3, 4], "lof": [1, 3, 2, 4, 0], "spf": [1, 3, 4, 2, 0]}
    assert first_token_order == want[policy]
    assert_all_free(sched)


def test_spf_counts_only_what_the_prefix_cache_does_not_hold(make_scheduler: Any) -> None:
    sched = make_scheduler(max_running=1, policy="spf", page_size=4)
    sched.budget.prompt_token_s = 1.0  # a window far wider than the arrivals' gaps
    run(sched, [Generate(0, PROMPTS[5], GREEDY)])  # its 20 prompt tokens stay cached
    follow_up = PROMPTS[5] + [9, 9, 9]  # 23 tokens, 20 of them cached: 3 to compute
    first: list[int] = []
    for m in (Generate(1, PROMPTS[1], GREEDY), Generate(2, follow_up, GREEDY)):  # 8, then 23
        assert sched.add_request(m) is None
    while sched.has_work:
        first += [o.rid for o in sched.step() if o.rid not in first]
    assert first == [2, 1]
    assert_all_free(sched)


def test_an_unknown_policy_is_an_error_that_names_the_choices(make_scheduler: Any) -> None:
    with pytest.raises(ValueError, match="policy must be one of .*fcfs.*lof.*'sjf'"):
        make_scheduler(policy="sjf")


def test_mixed_chunk_size_caps_prefill_beside_decodes(make_scheduler: Any) -> None:
    ref = run(make_scheduler(), [Generate(i, p, GREEDY) for i, p in enumerate(PROMPTS[:3])])
    sched = make_scheduler(chunk_size=64, mixed_chunk_size=4)
    assert sched.add_request(Generate(0, PROMPTS[0], GREEDY)) is None
    batch = sched.schedule()  # nothing decodes yet: the whole 5-token prompt
    assert batch is not None and batch.extend_lens == [5]
    sched.process_results(batch, sched.launch(batch))
    for rid in (1, 2):
        assert sched.add_request(Generate(rid, PROMPTS[rid], GREEDY)) is None
    outs: dict[int, list[int]] = {0: [ref[0][0].token]}
    prefill_tokens = []
    while sched.has_work:
        batch = sched.schedule()
        assert batch is not None
        decodes = [r for r in batch.reqs if r.is_decoding and r.extend_len == 1]
        prefill_tokens.append(sum(batch.extend_lens) - len(decodes))
        for o in sched.process_results(batch, sched.launch(batch)):
            outs.setdefault(o.rid, []).append(o.token)
        check_invariants(sched)
    # The 8- and 11-token prompts go in 4 tokens a step beside the decodes.
    assert max(prefill_tokens) == 4 and sum(prefill_tokens) == 8 + 11
    assert outs == {r: tokens(o) for r, o in ref.items()}
    assert_all_free(sched)


def test_mixed_step_tokens_caps_steps_with_enough_decodes(make_scheduler: Any) -> None:
    msgs = [Generate(i, p, GREEDY) for i, p in enumerate(PROMPTS)]
    ref = run(make_scheduler(), msgs)
    sched = make_scheduler(chunk_size=16, mixed_step_tokens=8)  # from 2 decodes, at least 1
    for m in msgs:
        assert sched.add_request(m) is None
    outs: dict[int, list[int]] = {}
    steps: list[tuple[int, int]] = []  # (decodes, tokens)
    while sched.has_work:
        batch = sched.schedule()
        assert batch is not None
        steps.append((sum(1 for r in batch.reqs if r.is_decoding and r.extend_len == 1),
                      sum(batch.extend_lens)))
        for o in sched.process_results(batch, sched.launch(batch)):
            outs.setdefault(o.rid, []).append(o.token)
        check_invariants(sched)
    assert steps[0] == (0, 16)  # nothing decodes yet: a whole chunk (the 5 and 8, 3 of 11)
    mixed = [(d, t) for d, t in steps if d >= 2 and t > d]
    assert len(mixed) > 3 and all(t <= max(8, d + 1) for d, t in mixed), mixed
    assert (2, 8) in mixed  # without the cap: (2, 16)
    assert outs == {r: tokens(o) for r, o in ref.items()}
    assert_all_free(sched)


def test_abort_in_every_state_frees_everything_once(make_scheduler: Any) -> None:
    sched = make_scheduler(chunk_size=8, max_running=2)
    long = SamplingParams(max_new_tokens=1000, ignore_eos=True)
    for rid, prompt in enumerate([PROMPTS[1], PROMPTS[5], PROMPTS[2], PROMPTS[3]]):
        assert sched.add_request(Generate(rid, prompt, long)) is None
    sched.step()
    sched.step()
    states = {rid: (req.status, req.is_decoding) for rid, req in sched.reqs.items()}
    assert states[0] == (ReqStatus.RUNNING, True)  # decoding
    assert states[1] == (ReqStatus.RUNNING, False)  # prefilled in chunks
    assert states[2] == states[3] == (ReqStatus.WAITING, False)  # no slot yet
    for rid in (1, 0, 3, 0, 99):  # 0 twice and an unknown rid: no-ops
        sched.abort(rid)
        check_invariants(sched)
    run(sched, [])  # request 2 gets a slot and runs on
    sched.abort(2)
    assert_all_free(sched)
    sched.abort(2)  # finished/aborted: no-op


def test_stop_conditions(make_scheduler: Any) -> None:
    sched = make_scheduler(kv_tokens=40)  # max_context 40
    ref = tokens(run(sched, [Generate(0, PROMPTS[2], GREEDY)])[0])
    stop_at = ref[4]
    first = ref.index(stop_at)
    outs = run(sched, [
        Generate(1, PROMPTS[2], SamplingParams(max_new_tokens=12, stop_token_ids=[stop_at])),
        Generate(2, PROMPTS[2], SamplingParams(max_new_tokens=12, stop_token_ids=[stop_at],
                                                min_new_tokens=first + 2)),
        Generate(3, PROMPTS[5], SamplingParams(max_new_tokens=100, ignore_eos=True)),
    ])
    assert tokens(outs[1]) == ref[: first + 1] and outs[1][-1].finish == "stop"
    assert stop_at not in tokens(outs[2])[: first + 2]
    assert len(PROMPTS[5]) + len(outs[3]) == 40 and outs[3][-1].finish == "length"
    assert all(o.finish is None for o in outs[3][:-1])
    assert_all_free(sched)


def test_requests_that_cannot_fit_get_errors(make_scheduler: Any) -> None:
    sched = make_scheduler(kv_tokens=32)
    err = sched.add_request(Generate(0, list(range(3, 35)), GREEDY))
    assert isinstance(err, Error) and err.rid == 0
    assert "32 tokens" in err.message and "max_context is 32" in err.message
    assert err.code is ErrorCode.CONTEXT_TOO_LONG
    err = sched.add_request(Generate(1, [5, 300], GREEDY))
    assert isinstance(err, Error) and "300" in err.message and "256" in err.message
    assert err.code is ErrorCode.INVALID_REQUEST
    err = sched.add_request(Generate(2, [], GREEDY))
    assert isinstance(err, Error) and err.code is ErrorCode.INVALID_REQUEST
    assert sched.add_request(Generate(3, [5], GREEDY)) is None
    err = sched.add_request(Generate(3, [5], GREEDY))  # duplicate rid: the router's bug
    assert isinstance(err, Error) and err.code is ErrorCode.BAD_MESSAGE
    run(sched, [])
    assert_all_free(sched)


def test_seeded_sampling_is_reproducible_through_the_scheduler(make_scheduler: Any) -> None:
    sched = make_scheduler()
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    alone = tokens(run(sched, [Generate(0, PROMPTS[3], sp)])[0])
    other = SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True)
    both = run(sched, [Generate(1, PROMPTS[3], other), Generate(2, PROMPTS[3], sp)])
    assert tokens(both[2]) == alone


def test_load_reports_usage(make_scheduler: Any) -> None:
    sched = make_scheduler(kv_tokens=64)
    assert sched.add_request(Generate(0, PROMPTS[1], GREEDY)) is None
    assert sched.add_request(Generate(1, PROMPTS[2], GREEDY)) is None
    now = load(sched)
    assert (now.waiting, now.running, now.kv_used, now.kv_total) == (2, 0, 0, 64)
    sched.step()
    now = load(sched)
    assert (now.waiting, now.running) == (0, 2)
    assert now.kv_used == len(PROMPTS[1]) + len(PROMPTS[2])
    assert now.kv_cached == 0
    assert now.prompt_tokens == len(PROMPTS[1]) + len(PROMPTS[2])
    assert now.cached_prompt_tokens == 0
