"""The scheduler's host time per step, without a GPU: the offline workload of
`benches/offline.py` (256 requests, 1,041 steps) through the real Scheduler on the CPU, with
the engine's forward replaced by an instant random-token stub, so only the host's
bookkeeping (admission, page allocation, page table, batch building, results) is timed.

    PYTHONPATH=python python benches/scheduler_host.py [--profile]
"""

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
    args = p.parse_args()
    path = Path(tempfile.mkdtemp()) / "tiny"
    tiny_model(path)
    llm = LLM(path, device="cpu", load_format="dummy", kv_tokens=300_000, max_running=256,
              cache=args.cache)

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
          f"scheduling ({args.cache} cache)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
