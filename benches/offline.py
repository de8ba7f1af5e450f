"""mini-sglang's offline benchmark workload (its benchmark/offline/bench.py) through our
offline API, with random weights in a real model's shape:

    python benches/offline.py --model benches/models/qwen3-0.6b

256 requests of random token ids in [0, 10000], input and output lengths uniform in
[100, 1024] (Python's `random.seed(0)`, drawn in mini-sglang's order), ignore_eos,
temperature 0.6. One warm-up generate, then `--repeats` timed runs of the whole workload,
each with the prefix cache emptied first. Prints output tokens, seconds and tok/s. There is
no built-in figure to compare with: machines differ by a few percent, so the ratio to
mini-sglang comes only from running both in the same device call (scripts/gpu-compare,
then benches/compare_table.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import torch
from common import drop_prefix_cache, mixed_graph_option, workload
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.budget import StepBudget


def step_budget(config: str, derived: StepBudget) -> StepBudget:
    """A --configs entry, POLICY:MIXED_CHUNK[:STEP_TOKENS] (e.g. lof:8192:256), as the
    scheduler's StepBudget (the chunk and spf's token estimate kept from `derived`)."""
    policy, mixed, *steps = config.split(":")
    return StepBudget(derived.chunk_size, policy, int(mixed), int(steps[0]) if steps else 0,
                      derived.prompt_token_s)


def run_config(llm: LLM, name: str, label: str, prompts: list[list[int]],
               params: list[SamplingParams], repeats: int) -> list[dict]:
    rows = []
    for rep in range(repeats):
        drop_prefix_cache(llm)  # every repetition starts cold, like a fresh process
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        results = llm.generate(prompts, params)
        seconds = time.perf_counter() - t
        tokens = sum(len(r["token_ids"]) for r in results)
        assert tokens == sum(sp.max_new_tokens for sp in params), "a request stopped early"
        cached = sum(r["cached_tokens"] for r in results)
        rows.append({"model": name, "config": label, "rep": rep + 1, "output_tokens": tokens,
                     "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 1),
                     "cached_prompt_tokens": cached})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--page-size", type=int, default=0, help="0: the engine's default")
    p.add_argument("--chunk-size", type=int, default=8192)
    p.add_argument("--cache", default="radix", choices=["radix", "naive"])
    p.add_argument("--configs", default="",
                   help="comma-separated POLICY:MIXED_CHUNK[:MIXED_STEP_TOKENS] scheduler "
                        "settings to run in turn (e.g. fcfs:8192,lof:8192:256); empty: the "
                        "offline API's defaults. A trailing /piecewise runs that setting's "
                        "mixed steps through the piecewise graphs instead of the whole "
                        "mixed-step graphs")
    p.add_argument("--mixed-graph-tokens", type=int,
                   default=None,
                   help="EngineConfig.cuda_graph_mixed_tokens: whole CUDA graphs for mixed steps "
                        "of up to this many tokens (engine/graphs/mixed.py); 0: none "
                        "(default: EngineConfig's)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"],
                   help="EngineConfig.kv_cache_dtype: the model's dtype, or e4m3 (half the "
                        "bytes of bf16: twice the KV tokens in the same memory)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=-1,
                   help="EngineConfig.cuda_graph_max_bs (-1: the GPU's default)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks (GPUs 0..tp-1; this process is rank 0)")
    p.add_argument("--json", help="append one JSON line of results to this file")
    args = p.parse_args()
    if args.tp > 1 and args.configs:
        p.error("--configs changes rank 0's scheduler only: not with --tp > 1")
    logging.basicConfig(level=os.environ.get("MINISGL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = Path(args.model).name
    t0 = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", page_size=args.page_size,
              chunk_size=args.chunk_size, cache=args.cache, tp=args.tp,
              kv_cache_dtype=args.kv_cache_dtype, cuda_graph_max_bs=args.cuda_graph_max_bs,
              **mixed_graph_option(args.mixed_graph_tokens))
    startup = time.perf_counter() - t0
    prompts, params = workload(args.num_requests)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0.1, max_new_tokens=8))  # warm-up
    rows = []
    sched, engine = llm.scheduler, llm.engine
    routes = engine.routes if "/" in args.configs else None  # only "/piecewise" touches it
    for config in args.configs.split(",") if args.configs else [""]:
        config, _, variant = config.partition("/")
        assert variant in ("", "piecewise"), f"unknown variant /{variant}"
        if config:
            sched.budget = step_budget(config, sched.budget)
        if routes is not None:  # "/piecewise": the mixed-step graphs left out of the table
            engine.routes = dataclasses.replace(routes, sizes=dataclasses.replace(
                routes.sizes, mixed=[])) if variant else routes
        b = sched.budget
        label = f"{b.policy}:{b.mixed_chunk_size}" + (
            f":{b.mixed_step_tokens}" if b.mixed_step_tokens else "") + (
            f"/{variant}" if variant else "") + (
            f" kv:{args.kv_cache_dtype}" if args.kv_cache_dtype != "auto" else "")
        rows += run_config(llm, name, label, prompts, params, args.repeats)
    if routes is not None:
        engine.routes = routes
    overlap, slots = llm.scheduler.overlap, llm.engine.kv_pool.num_slots
    longest = max(len(pr) + sp.max_new_tokens for pr, sp in zip(prompts, params))
    print(f"\n{name}: startup {startup:.1f} s (weights, JIT check, KV sizing, CUDA graphs), "
          f"overlap {'on' if overlap else 'off'}, page {llm.engine.page_size}, "
          f"KV {slots:,} tokens of {str(llm.engine.kv_dtype).removeprefix('torch.')} "
          f"(the largest batch that fits: {slots // longest:,} requests of the workload's "
          f"longest, {longest:,} tokens; max running {llm.engine.max_running})")
    print("| model | scheduler | rep | output tokens | cached prompt tokens | seconds | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {name} | {r['config']} | {r['rep']} | {r['output_tokens']:,} | "
              f"{r['cached_prompt_tokens']:,} | {r['seconds']:.2f} | {r['tok_s']:,.0f} |")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps({**r, "startup_s": round(startup, 1), "overlap": overlap,
                                    **vars(args), "page_size": llm.engine.page_size,
                                    "kv_tokens": slots}) + "\n")
    llm.shutdown()


if __name__ == "__main__":
    main()
