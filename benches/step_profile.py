"""Where the offline workload's time goes, step by step, on the GPU:

    python benches/step_profile.py --model benches/models/qwen3-0.6b

Runs benches/offline.py's workload once (cold cache) with the scheduler's phases wrapped:
host seconds in `schedule`, `launch` (the engine's forward_batch: plan, copies, kernel
launches or graph replay) and `process_results` (of which: waiting for the batch's tokens),
and CUDA events around each batch's forward on the stream, which give its GPU span and the
GPU's idle time before it (a gap means the host, not the GPU, was the bottleneck). Steps
are split by kind: decode batches that replay a CUDA graph, batches with prefill tokens
that replay whole mixed-step graphs (on by default; --mixed-graph-tokens) or piecewise
graphs, and those run eagerly. Then `--profile-steps` steps from the middle of a second run
under torch.profiler: GPU time per kernel, to see what a step is made of (`--trace` keeps
the Chrome trace for benches/trace_kernels.py)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from common import drop_prefix_cache, mixed_graph_option, workload
from minisgl_worker.core import Batch, RouteKind
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

KINDS = {RouteKind.DECODE_GRAPH: "decode (graph)",
         RouteKind.MIXED_GRAPH: "with prefill (mixed-step graphs)",
         RouteKind.PIECEWISE: "with prefill (piecewise graphs)",
         RouteKind.EAGER: "eager"}


def prompt_tokens(batch: Batch) -> int:
    """The batch's prompt tokens: every row but decodes (a request with output that extends
    by one token, as `Batch.phase` counts them; a one-token prompt chunk is a prompt)."""
    return sum(n for r, n in zip(batch.reqs, batch.extend_lens, strict=True)
               if not (r.is_decoding and n == 1))


class StepTimer:
    """Wraps a scheduler's phases; `rows` holds one dict per launched batch."""

    def __init__(self, llm: LLM) -> None:
        self.sched, self.engine = llm.scheduler, llm.engine
        self.host: dict[str, float] = defaultdict(float)
        self.rows: list[dict] = []
        self.t0 = 0.0  # the run's start (reset)
        self.first: dict[int, float] = {}  # rid -> seconds from t0 to its first token
        self.profile_at: tuple[int, int] | None = None  # (first step, last step) to profile
        self.prof: torch.profiler.profile | None = None
        sched, engine = self.sched, self.engine
        schedule, launch, process = sched.schedule, sched.launch, sched.process_results
        forward = engine.forward_batch

        def timed_schedule():
            t = time.perf_counter()
            batch = schedule()
            self.host["schedule"] += time.perf_counter() - t
            return batch

        def timed_launch(batch):
            self._maybe_profile(len(self.rows))
            t = time.perf_counter()
            out = launch(batch)
            self.host["launch"] += time.perf_counter() - t
            return out

        def timed_forward(batch):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            kind = KINDS[engine.routes.route(batch).kind]
            start.record()
            out = forward(batch)
            end.record()
            self.rows.append({"start": start, "end": end, "kind": kind, "reqs": batch.size,
                              "tokens": int(batch.input_ids.numel()),
                              "prompt": prompt_tokens(batch),
                              "kv": sum(r.device_len for r in batch.reqs)})
            return out

        def timed_process(batch, out):
            t = time.perf_counter()
            out.tokens()
            self.host["wait"] += time.perf_counter() - t
            result = process(batch, out)
            now = time.perf_counter()
            self.host["process"] += now - t
            for token in result:
                self.first.setdefault(token.rid, now - self.t0)
            return result

        sched.schedule, sched.launch, sched.process_results = (
            timed_schedule, timed_launch, timed_process)
        engine.forward_batch = timed_forward

    def _maybe_profile(self, step: int) -> None:
        if self.profile_at is None:
            return
        first, last = self.profile_at
        if step == first:
            self.prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU,
                            torch.profiler.ProfilerActivity.CUDA])
            self.prof.start()
        elif step == last and self.prof is not None:
            torch.cuda.synchronize()
            self.prof.stop()
            self.profile_at = None

    def reset(self) -> None:
        self.host.clear()
        self.rows.clear()
        self.first.clear()
        self.t0 = time.perf_counter()

    def dump(self, path: str) -> None:
        """One JSON line per batch: kind, requests, tokens, KV tokens read, GPU ms."""
        torch.cuda.synchronize()
        with open(path, "w") as f:
            for r in self.rows:
                row = {k: v for k, v in r.items() if k not in ("start", "end")}
                row["ms"] = round(r["start"].elapsed_time(r["end"]), 4)
                f.write(json.dumps(row) + "\n")

    def report(self, wall: float) -> None:
        torch.cuda.synchronize()
        kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        prev_end = None
        for r in self.rows:
            k = kinds[r["kind"]]
            k["steps"] += 1
            k["reqs"] += r["reqs"]
            k["tokens"] += r["tokens"]
            k["gpu_s"] += r["start"].elapsed_time(r["end"]) / 1e3
            if prev_end is not None:
                k["idle_before_s"] += max(0.0, prev_end.elapsed_time(r["start"]) / 1e3)
            prev_end = r["end"]
        firsts = sorted(self.first.values())
        ttft = (f"; first tokens (all requests given at once, as `inf`): p50 "
                f"{firsts[len(firsts) // 2]:.3f} s, p90 {firsts[len(firsts) * 9 // 10]:.3f} s"
                if firsts else "")
        print(f"wall {wall:.3f} s, {len(self.rows)} batches{ttft}")
        print("| batches | steps | mean reqs | mean tokens | GPU span s | ms/step | "
              "GPU idle before s |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, k in kinds.items():
            n = k["steps"]
            print(f"| {name} | {n:.0f} | {k['reqs'] / n:.1f} | {k['tokens'] / n:.1f} | "
                  f"{k['gpu_s']:.3f} | {1e3 * k['gpu_s'] / n:.2f} | {k['idle_before_s']:.3f} |")
        steps = max(1, len(self.rows))
        print("host seconds: " + ", ".join(
            f"{name} {s:.3f} ({1e3 * s / steps:.2f} ms/step)" for name, s in self.host.items()))


def online_workload(seed: int, n: int = 400) -> tuple[list[list[int]], list[SamplingParams]]:
    """scripts/gpu-online's request lengths for `seed` (input 1024, output 128, each times
    [0.5, 1.5], drawn as benches/online/online_datasets.random_set draws them), random ids,
    greedy and ignore_eos as the online bench asks."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "online"))
    from online_datasets import uniform_lengths

    rng = random.Random(seed)
    ins, outs = uniform_lengths(rng, n, 1024, 0.5), uniform_lengths(rng, n, 128, 0.5)
    ids = np.random.default_rng(seed)
    prompts = [ids.integers(0, 10000, size=i).tolist() for i in ins]
    return prompts, [SamplingParams(temperature=0.0, ignore_eos=True, max_new_tokens=o)
                     for o in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b")
    p.add_argument("--page-size", type=int, default=0, help="0: the engine's default")
    p.add_argument("--chunk-size", type=int, default=8192)
    p.add_argument("--policy", default=None,
                   help="the scheduler's queue order: fcfs or lof (default: derived, "
                        "scheduler/budget.py)")
    p.add_argument("--mixed-chunk-size", type=int, default=None,
                   help="prefill tokens beside decodes; 0: the chunk size (default: derived)")
    p.add_argument("--mixed-step-tokens", type=int, default=None,
                   help="cap on a step with decodes; 0: off (default: derived)")
    p.add_argument("--mixed-graph-tokens", type=int,
                   default=None,
                   help="whole CUDA graphs for mixed steps of up to this many tokens "
                        "(EngineConfig.cuda_graph_mixed_tokens, engine/graphs/mixed.py); 0: none "
                        "(default: EngineConfig's)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"],
                   help="EngineConfig.kv_cache_dtype: the model's dtype, or e4m3")
    p.add_argument("--profile-first", type=int, default=400, help="first step profiled")
    p.add_argument("--profile-steps", type=int, default=20, help="0: the timed run only")
    p.add_argument("--trace", help="write the profiled steps' Chrome trace here")
    p.add_argument("--rows", help="write the timed run's batches here, one JSON line each")
    p.add_argument("--online", type=int, metavar="SEED",
                   help="scripts/gpu-online's random set of this seed instead of mini-sglang's "
                        "workload (its rate inf used seed 3)")
    args = p.parse_args()
    logging.basicConfig(level=os.environ.get("MINISGL_LOG_LEVEL", "WARNING"))
    llm = LLM(args.model, load_format="dummy", page_size=args.page_size,
              chunk_size=args.chunk_size, policy=args.policy,
              mixed_chunk_size=args.mixed_chunk_size, mixed_step_tokens=args.mixed_step_tokens,
              kv_cache_dtype=args.kv_cache_dtype, **mixed_graph_option(args.mixed_graph_tokens))
    prompts, params = workload(256) if args.online is None else online_workload(args.online)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0.1, max_new_tokens=8))  # warm-up
    timer = StepTimer(llm)
    for run in ("timed", "profiled") if args.profile_steps else ("timed",):
        drop_prefix_cache(llm)
        timer.reset()
        if run == "profiled":
            timer.profile_at = (args.profile_first, args.profile_first + args.profile_steps)
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompts, params)
        wall = time.perf_counter() - t
        print(f"\n== {Path(args.model).name}, {run} run, page {llm.engine.page_size}, "
              f"{llm.scheduler.budget.describe()}, overlap {llm.scheduler.overlap} ==")
        timer.report(wall)
        if run == "timed" and args.rows:
            timer.dump(args.rows)
    if timer.prof is not None:
        print(f"\n== steps {args.profile_first}..+{args.profile_steps}: GPU time by kernel ==")
        print(timer.prof.key_averages().table(sort_by="self_device_time_total", row_limit=30,
                                              max_name_column_width=90))
        if args.trace:
            timer.prof.export_chrome_trace(args.trace)
    llm.shutdown()


if __name__ == "__main__":
    main()
