"""Random interleavings of generate / abort / step on a tiny pool, with and without overlap
scheduling (forced on here; CUDA's default): the accounting invariants hold after every
operation (with the cache's full integrity check); every request not aborted gets exactly
its max_new_tokens tokens, the last one marked "length", and an aborted one none after its
abort, however often the pool ran out and retracted it; once every request has ended every
page is free or evictable and every slot is free. Prompts share prefixes so that the radix
cache matches, splits and evicts under load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from minisgl_worker.protocol import Generate, SamplingParams, TokenOutput
from minisgl_worker.scheduler import Scheduler

SHARED = [(7 * i) % 250 + 3 for i in range(30)]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("generate"), st.integers(1, 30), st.integers(1, 6)),
        st.tuples(st.just("abort"), st.integers(0, 12), st.just(0)),
        st.tuples(st.just("step"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, page_size=st.sampled_from([1, 4, 16]), chunk=st.sampled_from([5, 64]),
       cache=st.sampled_from(["radix", "naive"]), policy=st.sampled_from(["fcfs", "lof"]),
       mixed=st.sampled_from([None, 2]), overlap=st.booleans())
def test_random_traffic_keeps_the_books(
    engine_factory: Any, tiny_llama: tuple[Path, Any], ops: list[tuple[str, int, int]],
    page_size: int, chunk: int, cache: str, policy: str, mixed: int | None, overlap: bool,
) -> None:
    engine = engine_factory(tiny_llama[0], kv_tokens=64, page_size=page_size, max_running=3)
    sched = Scheduler(engine, chunk_size=chunk, prefix_cache=cache, policy=policy,
                      mixed_chunk_size=mixed, overlap=overlap)
    wanted: dict[int, int] = {}  # rid -> max_new_tokens, for the requests not aborted
    got: dict[int, list[TokenOutput]] = {}

    def step() -> None:
        for out in sched.step():
            assert out.rid in wanted, f"a token for rid {out.rid} after its abort"
            got.setdefault(out.rid, []).append(out)
        sched.check_invariants()
        sched.cache.check_integrity()

    rid = 0
    for op, a, b in ops:
        if op == "generate":
            prompt = SHARED[:a] + [rid % 3 + 3] * (rid % 4)
            sp = SamplingParams(max_new_tokens=b, ignore_eos=True)
            assert sched.add_request(Generate(rid, prompt, sp)) is None
            wanted[rid] = b
            rid += 1
        elif op == "abort":
            if a in sched.reqs:
                del wanted[a]
                got.pop(a, None)
            sched.abort(a)
            sched.check_invariants()
        else:
            step()
    while sched.has_work:
        step()
    for r, n in wanted.items():
        outs = got.get(r, [])
        assert [o.finish for o in outs] == [None] * (n - 1) + ["length"], (r, n, outs)
    sizes = sched.cache.prefix_cache.sizes()
    assert sizes.protected_pages == 0
    assert sched.allocator.num_free + sizes.evictable_pages == sched.allocator.num_pages
    assert sched.table.num_free == sched.table.max_running
