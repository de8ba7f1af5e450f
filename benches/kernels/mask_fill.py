"""Host cost of grammar masks, without a model: llguidance's mask fill for a batch of
constrained rows by thread count, and advancing the rows by one token serially against in
parallel. The rows follow benches/structured.py's JSON schema, each advanced by a random
number of random allowed tokens (as a random-weight model samples them), so they sit in
varied states, mostly inside the long string field:

    python benches/kernels/mask_fill.py --tokenizer DIR [--rows 64] [--vocab 151936]

Prints milliseconds per call for each setting (best of --repeats) and the host's CPU count;
then, for the GIL's switch interval, how late a helper thread starts the fill while this
thread runs 1.5 ms of Python, and how long joining it then waits (constrain/prefetch.py)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llguidance as llg
import torch
from minisgl_worker.constrain import GrammarCache, RequestMatcher
from minisgl_worker.protocol import Constraint, ConstraintKind
from structured import SCHEMA


def allowed(mask: torch.Tensor, vocab: int) -> list[int]:
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab].nonzero().flatten().tolist()


def matchers(cache: GrammarCache, rows: int, vocab: int, seed: int) -> list[RequestMatcher]:
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    rng = random.Random(seed)
    words = (vocab + 31) // 32
    mask = torch.empty(words, dtype=torch.int32)
    out = []
    for _ in range(rows):
        m = RequestMatcher(cache.matcher(constraint))
        for _ in range(rng.randint(1, 200)):
            m.llmatcher.unsafe_compute_mask_ptr(mask.data_ptr(), words * 4)
            m.advance(rng.choice(allowed(mask, vocab)))
        out.append(m)
    return out


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="a folder with a tokenizer.json")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--vocab", type=int, default=151936, help="the logits' width")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    cache = GrammarCache(Path(args.tokenizer) / "tokenizer.json", args.vocab, [0])
    rows = matchers(cache, args.rows, args.vocab, seed=0)
    words = (args.vocab + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32)
    pairs = [(m.llmatcher, j) for j, m in enumerate(rows)]
    cpus = len(os.sched_getaffinity(0))
    print(f"{len(rows)} rows, vocab {args.vocab}, host CPUs {cpus} (os.cpu_count {os.cpu_count()})")
    for threads in [None, 1, 2, 4, 8, 16]:
        executor = llg.LLExecutor() if threads is None else llg.LLExecutor(num_threads=threads)
        ms = best_ms(lambda ex=executor: ex.unsafe_compute_mask_ptr(
            pairs, bitmask.data_ptr(), words * 4, len(rows)), args.repeats)
        print(f"fill, {threads or 'default'} threads: {ms:.3f} ms")
    tokens = [allowed(bitmask[j], args.vocab)[0] for j in range(len(rows))]

    def serial() -> None:
        for m, t in zip(rows, tokens):
            m.llmatcher.consume_token(t)
        for m in rows:
            m.llmatcher.rollback(1)

    def parallel(executor: llg.LLExecutor) -> None:
        executor.consume_token_par([(m.llmatcher, t) for m, t in zip(rows, tokens)])
        for m in rows:
            m.llmatcher.rollback(1)

    print(f"advance + rollback, serial: {best_ms(serial, args.repeats):.3f} ms")
    executor = llg.LLExecutor()
    print(f"advance + rollback, consume_token_par: {best_ms(lambda: parallel(executor), args.repeats):.3f} ms")

    helper_start_delay(llg.LLExecutor(num_threads=1), pairs, bitmask, words, args.repeats)


def helper_start_delay(executor: llg.LLExecutor, pairs: list, bitmask: torch.Tensor,
                       words: int, repeats: int) -> None:
    pool = ThreadPoolExecutor(1)

    def fill() -> float:
        started = time.perf_counter()
        executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), words * 4, len(pairs))
        return started

    default = sys.getswitchinterval()
    for interval in (default, 1e-4):
        sys.setswitchinterval(interval)
        delay = wait = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            future = pool.submit(fill)
            while time.perf_counter() < t0 + 1.5e-3:  # the scheduler's planning, as Python
                pass
            t1 = time.perf_counter()
            delay += future.result() - t0
            wait += time.perf_counter() - t1
        print(f"switch interval {interval * 1e3:g} ms: the helper starts after "
              f"{1e3 * delay / repeats:.3f} ms, joining it waits {1e3 * wait / repeats:.3f} ms")
    sys.setswitchinterval(default)
    pool.shutdown()


if __name__ == "__main__":
    main()
