"""The scheduler's host time per step, without a GPU: the offline workload of
`benches/offline.py` (256 requests, 1,041 steps) through the real Scheduler on the CPU, with
the engine's forward replaced by an instant random-token stub, so only the host's
bookkeeping (admission, page allocation, page table, batch building, results) is timed.

    PYTHONPATH=python python benches/scheduler_host.py [--profile] [--page-size 16]

Also prints the time spent in the CacheManager's `extend` (page allocation and the slots)
and `flush_table` (the step's page-table write), per step."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from minisgl_worker.core import Batch
from minisgl_worker.engine import ForwardOutput
from minisgl_worker.llm import LLM

sys.path.insert(0, str(Path(__file__).parent))
from offline import workload


def tiny_model(path: Path) -> None:
    """A 1-layer Llama config with a 10k vocabulary (random weights: load_format dummy)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 10240, "hidden_size": 64, '
        '"intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "max_position_embeddings": 4096, "eos_token_id": 2}'
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", action="store_true", help="print the top cProfile entries")
    p.add_argument("--cache", default="radix", choices=["radix", "naive"])
    p.add_argument("--page-size", type=int, default=16,
                   help="16: the engine's default on CUDA, whose bookkeeping this times")
    args = p.parse_args()
    path = Path(tempfile.mkdtemp()) / "tiny"
    tiny_model(path)
    llm = LLM(path, device="cpu", load_format="dummy", kv_tokens=300_000, max_running=256,
              cache=args.cache, page_size=args.page_size)

    def stub(batch: Batch) -> ForwardOutput:
        n = len(batch.sample_reqs)
        tokens = torch.randint(3, 10_000, (n,))
        return ForwardOutput(tokens, tokens, None, [None] * n, [None] * n)

    llm.engine.forward_batch = stub  # type: ignore[method-assign]
    steps = 0
    step = llm.scheduler.step

    def counted() -> list:  # type: ignore[type-arg]
        nonlocal steps
        steps += 1
        return step()

    llm.scheduler.step = counted  # type: ignore[method-assign]
    phases = {name: timed(llm.scheduler.cache, name) for name in ("extend", "flush_table")}
    prompts, params = workload(256)
    profiler = cProfile.Profile() if args.profile else None
    t = time.perf_counter()
    if profiler:
        profiler.enable()
    llm.generate(prompts, params)
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - t
    print(f"{steps} steps, {seconds:.2f} s, {1000 * seconds / steps:.2f} ms/step of host "
          f"scheduling ({args.cache} cache, page {args.page_size})")
    print("of which, ms a step: " + ", ".join(
        f"CacheManager.{name} {1000 * t[0] / steps:.3f}" for name, t in phases.items()))
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def timed(obj: object, name: str) -> list[float]:
    """Wrap obj.name with a timer -> [seconds spent in it so far]."""
    method, total = getattr(obj, name), [0.0]

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t

    setattr(obj, name, wrapper)
    return total


if __name__ == "__main__":
    main()
