"""Random interleavings of generate / abort / step on a tiny pool, with and without overlap
scheduling (forced on here; CUDA's default):
- the accounting invariants hold after every operation, with the cache's full integrity
  check and each running request's row of the page table against its pages;
- every request not aborted gets exactly its max_new_tokens tokens, the last one marked
  "length", and an aborted one none after its abort, however often the pool ran out and
  retracted it; a constrained one (a regex no output here can finish, over the models' byte
  tokens) only tokens its grammar allows, however often it was retracted or planned ahead,
  and whenever its grammar (compiled off the loop, as serving does) was handed over;
- once every request has ended, every page is free or evictable and every slot is free.
Prompts share prefixes so that the radix cache matches, splits and evicts under load."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from minisgl_worker.protocol import (
    Constraint,
    ConstraintKind,
    Generate,
    SamplingParams,
    TokenOutput,
)
from minisgl_worker.scheduler import Scheduler
from minisgl_worker.scheduler.report import check_invariants

from ..conftest import LLAMA3_ROPE, open_mixed_gate, save_byte_tokenizer, save_tiny_model

SHARED = [(7 * i) % 250 + 3 for i in range(30)]
LETTERS = [Constraint(ConstraintKind.REGEX, f"[a-z]{{10,{n}}}") for n in (20, 30)]  # byte
OPS = st.lists(  # tokens: 10 at least, so max_new_tokens (<= 6) always ends them
    st.one_of(
        st.tuples(st.just("generate"), st.integers(1, 30), st.integers(1, 6)),
        st.tuples(st.just("constrained"), st.integers(1, 30), st.integers(1, 6)),
        st.tuples(st.just("abort"), st.integers(0, 12), st.just(0)),
        st.tuples(st.just("step"), st.just(0), st.just(0)),
        st.tuples(st.just("compiled"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


COMMON = {  # the scheduler's settings, drawn for each example
    "page_size": st.sampled_from([1, 4, 16]), "chunk": st.sampled_from([5, 64]),
    "cache": st.sampled_from(["radix", "naive"]), "policy": st.sampled_from(["fcfs", "lof", "spf"]),
    "mixed": st.sampled_from([None, 2]), "steps": st.sampled_from([None, 4, 8]),
}


@pytest.fixture(scope="module")
def byte_llama(tiny_llama: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama beside a byte-level tokenizer (grammars need one)."""
    path = tmp_path_factory.mktemp("byte-llama")
    for f in tiny_llama[0].iterdir():
        shutil.copy(f, path)
    save_byte_tokenizer(path)
    return path


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, overlap=st.booleans(), **COMMON)
def test_random_traffic_keeps_the_books(
    engine_factory: Any, byte_llama: Path, ops: list[tuple[str, int, int]],
    page_size: int, chunk: int, cache: str, policy: str, mixed: int | None, steps: int | None,
    overlap: bool,
) -> None:
    engine = engine_factory(byte_llama, kv_tokens=64, page_size=page_size, max_running=3)
    drive(Scheduler(engine, chunk_size=chunk, prefix_cache=cache, policy=policy,
                    mixed_chunk_size=mixed, mixed_step_tokens=steps, overlap=overlap), ops)


@pytest.fixture(scope="module")
def cuda_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cuda-llama")  # head_dim 64: FlashInfer has no 16
    save_tiny_model(path, hidden_size=256, rope_scaling=LLAMA3_ROPE)
    save_byte_tokenizer(path)
    return path


@pytest.mark.gpu
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, **COMMON)
def test_random_traffic_keeps_the_books_on_cuda(
    engine_factory: Any, cuda_llama: Path, monkeypatch: pytest.MonkeyPatch,
    ops: list[tuple[str, int, int]], page_size: int, chunk: int, cache: str, policy: str,
    mixed: int | None, steps: int | None,
) -> None:
    """The same on CUDA's defaults (bf16, FlashInfer, CUDA graphs, overlap on), plus the
    whole mixed-step graphs, their gate opened (three requests at most): the batch in flight
    is really in flight, its tokens land in the GPU token pool, and page-table writes are
    queued and flushed (a released request's queued writes must never land)."""
    open_mixed_gate(monkeypatch)
    engine = engine_factory(cuda_llama, device="cuda", dtype="bfloat16", kv_tokens=64,
                            page_size=page_size, max_running=3, chunk_size=64,
                            cuda_graph_max_tokens=64, cuda_graph_mixed_tokens=64)
    sched = Scheduler(engine, chunk_size=chunk, prefix_cache=cache, policy=policy,
                      mixed_chunk_size=mixed, mixed_step_tokens=steps)
    assert sched.overlap
    drive(sched, ops)


def drive(sched: Scheduler, ops: list[tuple[str, int, int]]) -> None:
    """Run the ops, then every request to its end, checking the books after each one."""
    wanted: dict[int, int] = {}  # rid -> max_new_tokens, for the requests not aborted
    letters: set[int] = set()  # the constrained ones
    got: dict[int, list[TokenOutput]] = {}

    def step() -> None:
        for out in sched.step():
            assert out.rid in wanted, f"a token for rid {out.rid} after its abort"
            got.setdefault(out.rid, []).append(out)
        check_invariants(sched)
        sched.cache.check_integrity()
        check_page_table(sched)

    def hand_over() -> None:  # the grammars compiled off the loop, as its rank 0 does
        for r in sched.compiling.done():
            assert sched.grammar_compiled(r) is None
        check_invariants(sched)

    rid = 0
    for op, a, b in ops:
        if op in ("generate", "constrained"):
            prompt = SHARED[:a] + [rid % 3 + 3] * (rid % 4)
            grammar = LETTERS[a % 2] if op == "constrained" else None
            sp = SamplingParams(max_new_tokens=b, ignore_eos=True, constraint=grammar)
            assert sched.add_request(Generate(rid, prompt, sp), compile_now=False) is None
            while len(sched.compiling.done()) < len(sched.compiling):  # compiled now, so
                time.sleep(0.001)  # that an example runs the same every time
            wanted[rid] = b
            if grammar is not None:
                letters.add(rid)
            rid += 1
        elif op == "abort":
            if a in sched.reqs:
                del wanted[a]
                got.pop(a, None)
            sched.abort(a)
            check_invariants(sched)
        elif op == "compiled":
            hand_over()
        else:
            step()
    while sched.has_work:
        hand_over()
        step()
    for r, n in wanted.items():
        outs = got.get(r, [])
        assert [o.finish for o in outs] == [None] * (n - 1) + ["length"], (r, n, outs)
        assert r not in letters or all(ord("a") <= o.token <= ord("z") for o in outs), outs
    sizes = sched.cache.prefix_cache.sizes()
    assert sizes.protected_pages == 0
    assert sched.allocator.num_free + sizes.evictable_pages == sched.allocator.num_pages
    assert sched.table.num_free == sched.table.max_running


def check_page_table(sched: Scheduler) -> None:
    """Each running request's row of the engine's page table holds, for every position the
    last launched batch computed, the slot its pages give (slot = page * size + offset).
    Flushed first, as the next batch does before it reads the table (a prefix shared at
    launch rewrites the row's entries by queued writes)."""
    sched.cache.flush_table()
    table, ps = sched.engine.page_table, sched.page_size
    for req in sched.prefilling + sched.decode.reqs:
        pages = sched.cache._pages[req.rid]
        want = [pages[p // ps] * ps + p % ps for p in range(req.cached_len)]
        assert table[req.table_idx, : req.cached_len].tolist() == want, req
