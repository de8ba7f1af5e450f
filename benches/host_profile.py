"""Where the host's time goes in the engine's steps (cProfile), for eager (mixed) steps:

    python benches/host_profile.py --model benches/models/qwen3-0.6b --mixed-chunk-size 256

Submits the offline workload (benches/workload.py), runs `--warm-steps` steps so that
requests decode, then profiles `--steps` more: each step's `forward_batch` host time by
phase, and the functions that took the most time. cProfile inflates Python-heavy code, so
read the ranking, not the absolute figures."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import Generate
from offline import workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b")
    p.add_argument("--policy", default="lof")
    p.add_argument("--mixed-chunk-size", type=int, default=256)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--warm-steps", type=int, default=60)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=35)
    args = p.parse_args()
    llm = LLM(args.model, load_format="dummy", policy=args.policy,
              mixed_chunk_size=args.mixed_chunk_size)
    sched, engine = llm.scheduler, llm.engine
    prompts, params = workload(args.num_requests)
    for rid, (prompt, sp) in enumerate(zip(prompts, params)):
        assert sched.add_request(Generate(rid, prompt, sp)) is None
    for _ in range(args.warm_steps):
        sched.step()
    forward, times = engine.forward_batch, []

    def timed(batch):
        t = time.perf_counter()
        out = forward(batch)
        times.append((time.perf_counter() - t, batch.phase))
        return out

    engine.forward_batch = timed
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        sched.step()
    prof.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    for phase in sorted({ph for _, ph in times}):
        ts = [t for t, ph in times if ph == phase]
        print(f"{phase}: {len(ts)} steps, forward_batch host {1e3 * sum(ts) / len(ts):.2f} ms "
              "each (under cProfile)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    llm.shutdown()


if __name__ == "__main__":
    main()
