"""Where one decode step's time goes, on random weights in a real shape:

    python benches/decode_step.py --model benches/models/qwen3-0.6b

Builds `batch` running requests holding `context` tokens of KV each (the page table and
pool as the scheduler would leave them; the KV values are whatever the pool holds), then
times with CUDA events (median of `iters`): the CUDA-graph forward (plan + replay), the
sampler (greedy; temperature 0.6), the whole `Engine.forward_batch`, and the step's
attention alone (every layer's, as the batch's route runs it, replayed from one CUDA graph).
Prints the bytes a step must read (weights + KV) over the time, and the KV bytes over the
attention's time: the achieved share of ~4.3 TB/s. `--kv-cache-dtype fp8_e4m3` runs the
same over an FP8 KV cache (half the KV bytes of bf16). `--kernels N` also lists, for each
case, the N kernels the greedy graph forward spends most GPU time in (torch.profiler over
`iters` replays): where a small batch's step goes beyond its weight reads."""

from __future__ import annotations

import argparse
import logging
import random
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from minisgl_worker.attention import GraphAttnBackend
from minisgl_worker.core import Batch, Req, Route, RouteKind
from minisgl_worker.kvcache import MHAKVPool
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.transfer import to_device


def median_ms(fn: Callable[[], object], iters: int) -> float:
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def decode_batch(llm: LLM, size: int, context: int, sampling: SamplingParams) -> Batch:
    sched, device = llm.scheduler, llm.engine.device
    reqs, locs = [], []
    for i in range(size):
        req = Req(10**6 + i, [random.randrange(1000) for _ in range(context - 1)], sampling)
        req.output_ids = [7]
        req.table_idx = sched.table.allocate()
        sched.cache.admit(req)
        req.device_len = context
        locs.append(sched.cache.extend(req, context)[-1:])
        req.cached_len = context - 1
        reqs.append(req)
    sched.cache.flush_table()
    return Batch(reqs=reqs, input_ids=to_device([7] * size, device),
                 positions=to_device([context - 1] * size, device),
                 out_loc=to_device([int(x[0]) for x in locs], device),
                 extend_lens=[1] * size, sample_reqs=reqs)


def release(llm: LLM, batch: Batch) -> None:
    """Give a decode_batch's slots and pages back."""
    for req in batch.reqs:
        llm.scheduler.cache.release(req)
        llm.scheduler.table.free(req.table_idx)


def attention_ms(llm: LLM, batch: Batch, route: Route, iters: int) -> float:
    """Every layer's attention of the decode step (the kernels `route` names, over the
    batch's KV; random queries), captured in one CUDA graph and replayed."""
    engine, cfg = llm.engine, llm.engine.rank_config
    backend = engine.attn_backend
    assert isinstance(backend, GraphAttnBackend)
    q = torch.randn(route.size, cfg.num_heads, cfg.head_dim, dtype=engine.dtype,
                    device=engine.device)
    out = torch.empty_like(q)
    backend.prepare(batch, route)

    def all_layers() -> None:
        for layer in range(cfg.num_layers):
            backend.attend(layer, q, out)

    all_layers()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        all_layers()
    return median_ms(graph.replay, iters)


def kernel_table(llm: LLM, batch: Batch, iters: int, top: int) -> list[str]:
    """The greedy graph forward's `top` kernels by GPU time: us a step, launches a step."""
    from torch.profiler import ProfilerActivity, profile

    route = llm.engine.routes.route(batch)
    graphs = llm.engine.runners[route.kind]
    with torch.inference_mode():
        graphs.run(batch, route)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                graphs.run(batch, route)
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / iters
    lines = [f"kernels of batch {len(batch.reqs)}: {total:.1f} us a step on the GPU"]
    for e in events[:top]:
        lines.append(f"  {e.device_time_total / iters:8.1f} us  {e.count / iters:6.1f} x  "
                     f"{e.key[:90]}")
    return lines


def time_case(llm: LLM, batch: Batch, iters: int) -> tuple[float, float, float, float]:
    """-> (graph forward, sampler, forward_batch, attention) ms."""
    engine = llm.engine
    route = engine.routes.route(batch)
    assert route.kind is RouteKind.DECODE_GRAPH, route
    graphs = engine.runners[route.kind]
    with torch.inference_mode():
        graph_ms = median_ms(lambda: graphs.run(batch, route), iters)
        logits = graphs.run(batch, route).clone()
        sample_ms = median_ms(lambda: engine.sampler.sample(logits.clone(), batch.sample_reqs),
                              iters)
        total_ms = median_ms(lambda: engine.forward_batch(batch), iters)
        attn_ms = attention_ms(llm, batch, route, iters)
    return graph_ms, sample_ms, total_ms, attn_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b")
    p.add_argument("--cases", default="256x1024,64x1024,256x512", help="batch x context")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="list each case's N costliest kernels (0: none)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cases = [tuple(map(int, case.split("x"))) for case in args.cases.split(",")]
    # Decode graphs up to the largest batch, whatever the GPU's default (128 on an H100).
    largest = max(size for size, _ in cases)
    llm = LLM(args.model, load_format="dummy", max_running=max(256, largest),
              kv_cache_dtype=args.kv_cache_dtype, cuda_graph_max_bs=largest)
    engine, cfg = llm.engine, llm.engine.model_config
    weight_bytes = sum(t.numel() * t.element_size() for t in engine.model.parameters())
    kv_per_token = MHAKVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                             engine.kv_dtype)
    kv_name = str(engine.kv_dtype).removeprefix("torch.")
    rows, kernels = [], []
    for size, context in cases:
        for temp in (0.0, 0.6):
            batch = decode_batch(llm, size, context, SamplingParams(temperature=temp))
            graph_ms, sample_ms, total_ms, attn_ms = time_case(llm, batch, args.iters)
            kv_bytes = size * context * kv_per_token
            rows.append((Path(args.model).name, size, context, temp, graph_ms, sample_ms,
                         total_ms, (weight_bytes + kv_bytes) / total_ms / 1e9, attn_ms,
                         kv_bytes / attn_ms / 1e9))
            release(llm, batch)
    for size, context in cases if args.kernels else []:  # after every timing: the profiler
        batch = decode_batch(llm, size, context, SamplingParams(temperature=0.0))  # may linger
        kernels += kernel_table(llm, batch, args.iters, args.kernels)
        release(llm, batch)
    llm.shutdown()
    if kernels:
        print("\n".join(kernels))
    print(f"KV cache: {kv_name}")
    print("| model | batch | context | temperature | graph fwd ms | sampler ms | "
          "forward_batch ms | TB/s (weights + KV) | attention ms (all layers) | "
          "TB/s (KV) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.3f} | "
              f"{r[7]:.2f} | {r[8]:.3f} | {r[9]:.2f} |")


if __name__ == "__main__":
    main()
