"""What a step budget should cost on the offline workload, on the CPU in a second: the
workload's 256 requests (benches/workload.py) through the scheduler's StepBudget (queue order
and prompt tokens a step; no memory limit, as on the H200), each step priced by a cost model
of one H200 (below). A model, not a measurement: use it to rank settings before spending
device time on them, and check the winners with benches/offline.py.

    python benches/schedule_model.py --shape llama3.1-8b --configs fcfs:8192,lof:8192:256

Per step, with M its tokens (decodes and prompt chunks) and K the KV tokens its decodes read:
- the four GEMMs a layer, interpolated in M from cuBLAS alone on the H200 (RESULTS.md,
  "cuBLAS by M"; above 256 tokens at the 8,192-token prefill step's ~0.61 us a row a layer
  for Llama-3.1-8B, and 0.04 for Qwen3-0.6B's 16.6 ms steps), times the layers;
- K x the KV bytes a token / the decode kernels' ~3.8 TB/s;
- the LM head (its weights: 0.28 ms and 0.08 ms) whenever a row samples, and a fixed
  0.8 ms (norms, RoPE, SiLU, sampler, gaps) plus ~1.4 ns (Llama) a token of small kernels.

Against the H200 (eleventh session, RESULTS.md): Llama-3.1-8B fcfs:8192 13.17 s modelled,
13.33 measured; lof:8192:256 12.03 modelled, 12.43-12.77 measured; fcfs:8192:256 15.5
modelled, 16.4 measured. Qwen3-0.6B is modelled less well (fcfs:8192 5.53 s and
lof:8192:256 5.43 against 5.19-5.24 and 5.12-5.37 measured): its steps are mostly attention
and fixed costs, which this model prices coarsely."""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from minisgl_worker.core import Req
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.budget import StepBudget

sys.path.insert(0, str(Path(__file__).parent))
from offline import step_budget
from workload import draw

GEMM_M = [1, 8, 32, 64, 128, 160, 192, 200, 224, 232, 256]


class Shape(NamedTuple):
    layers: int
    kv_bytes: int  # a token, all layers
    gemm_us: list[float]  # the four GEMMs a layer at GEMM_M tokens (cuBLAS alone, H200)
    row_us: float  # a layer's GEMMs, a token above 256 (the 8,192-token prefill step's rate)
    lm_head_ms: float
    token_ms: float  # small kernels a token (norms, RoPE, SiLU at the prefill step's rate)


SHAPES = {
    "llama3.1-8b": Shape(32, 131_072, [115.5, 117.2, 120.9, 126.0, 135.0, 144.0, 159.3,
                                       154.2, 179.4, 174.4, 177.1], 0.61, 0.28, 1.4e-3),
    "qwen3-0.6b": Shape(28, 114_688, [30.6, 23.8, 24.1, 24.5, 24.7, 26.3, 26.8, 28.7, 29.1,
                                      28.7, 27.8], 0.04, 0.08, 0.2e-3),
}
FIXED_MS = 0.8
KV_BYTES_S = 3.8e12


def step_ms(shape: Shape, tokens: int, kv_tokens: int, samples: bool) -> float:
    if tokens <= GEMM_M[-1]:
        gemm_us = float(np.interp(tokens, GEMM_M, shape.gemm_us))
    else:
        gemm_us = shape.gemm_us[-1] + (tokens - GEMM_M[-1]) * shape.row_us
    return (gemm_us * shape.layers / 1e3 + FIXED_MS + shape.token_ms * tokens
            + (shape.lm_head_ms if samples else 0.0) + kv_tokens * shape.kv_bytes / KV_BYTES_S * 1e3)


class Modelled(NamedTuple):
    seconds: float
    steps: int
    weight_bound_steps: int  # fewer than 180 tokens: the GEMMs read weights for few rows


class Step(NamedTuple):
    decode_kv: list[int]  # each decode's KV tokens, its new one included
    chunks: list[tuple[int, int]]  # each prompt chunk's (tokens before it, its tokens)
    samples: bool  # whether a row samples (a decode, or a prompt's last chunk)


def schedule(budget: StepBudget) -> Iterator[Step]:
    """The workload's steps through `budget`, in order (decodes first, as the scheduler
    batches them; benches/mixed_attention.py replays their attention)."""
    prompts, outputs = draw()
    waiting: deque[Req] = deque()
    for i, (ids, out) in enumerate(zip(prompts, outputs)):
        budget.enqueue(waiting, Req(i, ids, SamplingParams(max_new_tokens=out)))
    prefilling: list[Req] = []  # prompt progress in each one's cached_len
    decoding: list[tuple[Req, int]] = []  # (request, tokens generated)
    while waiting or prefilling or decoding:
        room = budget.prompt_tokens(len(decoding))
        chunks, finished = [], []
        for req in [*prefilling, *waiting]:
            if room <= 0:
                break
            if req in waiting:
                waiting.remove(req)
                prefilling.append(req)
            take = min(len(req.input_ids) - req.cached_len, room)
            chunks.append((req.cached_len, take))
            req.cached_len += take
            room -= take
            if req.cached_len == len(req.input_ids):
                finished.append(req)
        yield Step([len(r.input_ids) + n for r, n in decoding], chunks,
                   bool(decoding or finished))
        decoding = [(r, n + 1) for r, n in decoding if n + 1 < r.sampling.max_new_tokens]
        for req in finished:  # its prefill step sampled its first token
            prefilling.remove(req)
            if req.sampling.max_new_tokens > 1:
                decoding.append((req, 1))


def model(shape: Shape, budget: StepBudget) -> Modelled:
    total_ms, steps, low = 0.0, 0, 0
    for step in schedule(budget):
        tokens = len(step.decode_kv) + sum(n for _, n in step.chunks)
        total_ms += step_ms(shape, tokens, sum(step.decode_kv), step.samples)
        steps, low = steps + 1, low + (tokens < 180)
    return Modelled(total_ms / 1e3, steps, low)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama3.1-8b", choices=list(SHAPES))
    p.add_argument("--configs", default="fcfs:8192,lof:8192,lof:8192:256,fcfs:8192:256",
                   help="POLICY:MIXED_CHUNK[:STEP_TOKENS], as benches/offline.py's --configs")
    args = p.parse_args()
    print("| shape | setting | modelled s | steps | steps under 180 tokens |")
    print("| --- | --- | ---: | ---: | ---: |")
    for config in args.configs.split(","):
        m = model(SHAPES[args.shape], step_budget(config, 8192))
        print(f"| {args.shape} | {config} | {m.seconds:.2f} | {m.steps} | {m.weight_bound_steps} |")


if __name__ == "__main__":
    main()
