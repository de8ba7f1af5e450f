"""Which launch constants should the whole-KV Triton decode use for each KV dtype, and does
FlashInfer's decode read that KV faster?

For each KV dtype (bf16, and FP8 e4m3 holding value / scale) and each shape (batch x
context, every request at that context; Llama-3.1-8B's layout by default: 32 query heads,
8 KV heads, head dim 128, page 16), times the engine's kernel (attention/triton_decode.py's
WholeKVDecode, launched as the engine launches it) at every Launch of the grid, and
FlashInfer's BatchDecodeWithPagedKVCacheWrapper over the same KV: tensor cores with the KV
whole and split (the engine's wrappers), and CUDA cores. The batch is padded to the engine's
decode-graph size with one-token rows. Each kernel runs in one CUDA graph over as many layers
(each its own pool tensor, as in the engine) as make one replay read >= 1 GiB, so the L2
holds none of it; times are per layer, TB/s are the real rows' KV bytes over them.

The grid: BLOCK_T x warps x stages for every dtype; for FP8 also the dots in fp16 and, with
4 warps, a 128-register cap (Launch's fields). Stage 6: Triton's pipeliner loads the page ids
a stage ahead of the tiles and, at this loop, keeps two tiles in flight only from 6 stages
(one at 2-5). FP8 at 128 x 4 warps takes ~170 registers, so two programs share an SM where
bf16's 128 let three: a cap of 128 lets four. (Read off Triton 3.9's output for sm_90a.)

Before timing, every Triton config and the FlashInfer JIT modules are compiled in parallel
processes (both keep their builds in a disk cache the timing process then loads).

    python benches/kernels/triton_decode_sweep.py [--kv-dtype bf16,fp8_e4m3]
        [--cases 256x1024,64x1024] [--block-t 64,128,256] [--warps 4,8] [--stages 2,3,4,6]
        [--fp16-dots 0,1] [--max-registers 0,128] [--flashinfer tc-whole,tc-split,cuda-cores]

Prints one row per (shape, KV dtype, kernel) as it goes, then per shape the best of each
kind, and per KV dtype the one Launch that is best over all shapes (its LAUNCH entry).
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from minisgl_worker.attention.triton_decode import LAUNCH, Launch, WholeKVDecode
from minisgl_worker.engine.route import graph_batch_sizes
from minisgl_worker.kvcache.quant import FP8, from_cache, to_cache
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import capture

BF16 = torch.bfloat16
KV_DTYPES = {"bf16": BF16, "fp8_e4m3": FP8}
LAYOUTS = {"llama-3.1-8b": (32, 8, 128, 16), "qwen3-0.6b": (16, 8, 128, 16)}  # hq hkv d page
FLASHINFER = {"tc-whole": (True, False), "tc-split": (True, True),
              "cuda-cores": (False, True)}  # name: (tensor cores, split KV)
CASES = "256x512,256x1024,256x2048,64x512,64x1024,64x2048,37x512,37x1024,37x2048"
FOOTPRINT = 1 << 30  # bytes one replay reads, at least: far past the 50 MB L2


class Pool(NamedTuple):
    """A padded decode batch over `layers` layers of paged KV: q (B, Hq, D); k, v (layers,
    pages, page, Hkv, D) in the KV dtype; indptr, last page lengths (host) and page ids
    (device) as FlashInfer's CSR; the real rows' KV bytes a layer; the K and V scales."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    indptr: torch.Tensor
    last: torch.Tensor
    indices: torch.Tensor
    kv_bytes: int
    scales: tuple[float, float]


def make_pool(batch: int, context: int, kv_dtype: torch.dtype, layout: str,
              device: torch.device, footprint: int = FOOTPRINT) -> Pool:
    hq, hkv, d, page = LAYOUTS[layout]
    padded = next(s for s in graph_batch_sizes(max(batch, 256)) if s >= batch)
    lens = [context] * batch + [1] * (padded - batch)
    pages = [-(-n // page) for n in lens]
    total = sum(pages)
    token_bytes = 2 * hkv * d * kv_dtype.itemsize  # K and V, one layer
    layers = max(1, -(-footprint // (total * page * token_bytes)))
    scales = (0.02, 0.02) if kv_dtype == FP8 else (1.0, 1.0)  # randn / 0.02 stays < 448
    k = torch.empty(layers, total, page, hkv, d, dtype=kv_dtype, device=device)
    v = torch.empty_like(k)
    for cache, scale in ((k, scales[0]), (v, scales[1])):
        cache[0] = to_cache(torch.randn(cache.shape[1:], dtype=BF16, device=device), kv_dtype,
                            scale)
        cache[1:] = cache[0]
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages)], dtype=torch.int32)
    return Pool(torch.randn(padded, hq, d, dtype=BF16, device=device), k, v, indptr, last,
                torch.randperm(total, dtype=torch.int32, device=device),
                batch * context * token_bytes, scales)


def gather_pages(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """cache[ids], FP8 through its bytes (not every torch indexes FP8 tensors on the GPU)."""
    if cache.dtype != FP8:
        return cache[ids]
    return cache.view(torch.uint8)[ids].view(FP8)


def reference(pool: Pool, rows: list[int]) -> torch.Tensor:
    """Layer 0's attention of `rows` in float32, over the KV read back through the scales."""
    q, (k_scale, v_scale) = pool.q, pool.scales
    hkv, d = pool.k.shape[3], pool.k.shape[4]
    out = []
    for b in rows:
        ids = pool.indices[int(pool.indptr[b]) : int(pool.indptr[b + 1])].long()
        n = (len(ids) - 1) * pool.k.shape[2] + int(pool.last[b])
        kb, vb = (from_cache(gather_pages(c[0], ids), torch.float32, s).reshape(-1, hkv, d)
                  [:n].repeat_interleave(q.shape[1] // hkv, 1)
                  for c, s in ((pool.k, k_scale), (pool.v, v_scale)))
        s = torch.einsum("hd,thd->ht", q[b].float(), kb) / math.sqrt(d)
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), vb))
    return torch.stack(out)


def triton_kernel(pool: Pool, launch: Launch):
    """-> (run layer l, its output): the engine's whole-KV kernel at `launch`."""
    hq, d = pool.q.shape[1:]
    attn = WholeKVDecode(pool.q.shape[0], hq, pool.k.shape[3], d, pool.k.shape[2], d**-0.5,
                         pool.indices, launch)
    attn.plan(pool.indptr, pool.last)
    out = torch.empty_like(pool.q)
    k_scale, v_scale = pool.scales
    return (lambda layer: attn.run(pool.q, (pool.k[layer], pool.v[layer]), out=out,
                                   k_scale=k_scale, v_scale=v_scale)), out


def flashinfer_kernel(pool: Pool, tensor_cores: bool, split: bool):
    """-> (run layer l, its output): FlashInfer's decode wrapper, planned for CUDA graphs."""
    import flashinfer

    dev, (hq, d), hkv, page = pool.q.device, pool.q.shape[1:], pool.k.shape[3], pool.k.shape[2]
    indptr, last = pool.indptr.to(dev), pool.last.to(dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=torch.zeros_like(indptr),
        paged_kv_indices_buffer=torch.zeros_like(pool.indices),
        paged_kv_last_page_len_buffer=torch.ones_like(last))
    wrapper.plan(indptr, pool.indices, last, hq, hkv, d, page, sm_scale=d**-0.5,
                 q_data_type=BF16, kv_data_type=pool.k.dtype, disable_split_kv=not split)
    out = torch.empty_like(pool.q)
    kw = {"k_scale": pool.scales[0], "v_scale": pool.scales[1]} if pool.k.dtype == FP8 else {}
    return (lambda layer: wrapper.run(pool.q, (pool.k[layer], pool.v[layer]), out=out,
                                      **kw)), out


def _warm(kv: str, layout: str, kernel: str | Launch) -> str | None:
    """(In a pool process) compile `kernel` (a Launch, or a FLASHINFER name) on a tiny
    batch, into the disk caches -> None, or why it cannot run."""
    pool = make_pool(2, 40, KV_DTYPES[kv], layout, torch.device("cuda"), footprint=0)
    try:
        if isinstance(kernel, str):
            run, _ = flashinfer_kernel(pool, *FLASHINFER[kernel])
        else:
            run, _ = triton_kernel(pool, Launch(*kernel))
        run(0)
        torch.cuda.synchronize()
    except OutOfResources as e:
        return f"out of resources: {e}"
    return None


def precompile(layout: str, launches: dict[str, list[Launch]],
               flashinfer: list[str]) -> dict[tuple, str]:
    """Every kernel the sweep times, compiled by parallel processes -> {(kv, kernel): why it
    cannot run} for those that cannot."""
    t0 = time.time()
    # The slow JIT builds first, one job a module (whole and split KV share theirs).
    kvs, modules = list(launches), {FLASHINFER[name][0]: name for name in flashinfer}
    jobs = [(kv, name) for kv in kvs for name in modules.values()]
    jobs += [(kv, tuple(launch)) for kv in kvs for launch in launches[kv]]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1), mp_context=spawn) as ex:
        futures = {job: ex.submit(_warm, job[0], layout, job[1]) for job in jobs}
        failed = {}
        for job, future in futures.items():
            try:
                why = future.result()
            except Exception as e:  # noqa: BLE001 - reported, and that kernel skipped
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if why is not None:
                failed[job] = why
    for kv, name in itertools.product(kvs, flashinfer):  # a module's failure fails its kernels
        built = kv, modules[FLASHINFER[name][0]]
        if built in failed:
            failed[kv, name] = failed[built]
    print(f"precompiled {len(jobs)} kernels in {time.time() - t0:.0f} s "
          f"({len(failed)} cannot run)", flush=True)
    for (kv, kernel), why in failed.items():
        print(f"  {kv} {kernel}: {why[:160]}")
    return failed


def time_us(run, layers: int) -> float:
    """Per layer: one CUDA graph of `run` over every layer, median of triton's do_bench."""
    from triton.testing import do_bench

    graph = capture(lambda: [run(layer) for layer in range(layers)])
    return 1e3 * do_bench(graph.replay, warmup=3, rep=15, return_mode="median") / layers


def sweep_shape(batch: int, context: int, kv: str, args, launches: list[Launch],
                failed: dict[tuple, str]) -> tuple[int, dict[str | Launch, float]]:
    """Every kernel over one shape and KV dtype (a row printed each) -> (the real rows' KV
    bytes a layer, {kernel: us} for those that ran and match the reference: relative error
    < 2e-2)."""
    pool = make_pool(batch, context, KV_DTYPES[kv], args.layout, torch.device("cuda"))
    rows = [0, batch // 2, batch - 1]
    ref = reference(pool, rows)
    kernels: list[str | Launch] = [k for k in args.flashinfer if (kv, k) not in failed]
    kernels += [launch for launch in launches if (kv, tuple(launch)) not in failed]
    result = {}
    for kernel in kernels:
        fi = isinstance(kernel, str)
        label = f"FlashInfer {kernel} | | |" if fi else "Triton{}{} | {} | {} | {}".format(
            ", fp16 dots" * kernel.fp16_dots,
            f", <= {kernel.max_registers} registers" * bool(kernel.max_registers), *kernel[:3])
        try:
            run, out = (flashinfer_kernel(pool, *FLASHINFER[kernel]) if fi else
                        triton_kernel(pool, kernel))
            run(0)
        except Exception as e:  # noqa: BLE001 - reported, and not tried at other shapes
            failed[kv, kernel if fi else tuple(kernel)] = why = f"{type(e).__name__}: {e}"
            print(f"| {batch}x{context} | {kv} | {label} | failed: {why[:120]} | | |")
            continue
        err = float((out[rows].float() - ref).abs().max() / ref.abs().max())
        us = time_us(run, pool.k.shape[0])
        print(f"| {batch}x{context} | {kv} | {label} | {us:.1f} | "
              f"{pool.kv_bytes / us / 1e6:.2f} | {err:.1e} |", flush=True)
        if err < 2e-2:
            result[kernel] = us
    kv_bytes = pool.kv_bytes
    del pool
    torch.cuda.empty_cache()
    return kv_bytes, result


def cell(us: float | None, kv_bytes: int) -> str:
    return f"{us:.1f} ({kv_bytes / us / 1e6:.2f})" if us else "-"


def summarize(kv: str, results: dict[tuple[int, int], tuple[int, dict]]) -> None:
    """Per shape: LAUNCH's entry, the best Triton launch and FlashInfer; then the Launch
    best over all shapes (geometric mean of its time over each shape's best Triton time)."""
    now = LAUNCH[KV_DTYPES[kv]]
    print(f"\n{kv}: us a layer (KV TB/s); LAUNCH now {tuple(now)}")
    print("| shape | LAUNCH now | best Triton (block, warps, stages, fp16 dots, registers) | "
          + " | ".join(f"FlashInfer {name}" for name in FLASHINFER) + " |")
    print("| --- | ---: | ---: |" + " ---: |" * len(FLASHINFER))
    for (batch, context), (nbytes, res) in results.items():
        best = min((k for k in res if not isinstance(k, str)), key=res.__getitem__,
                   default=None)
        print(f"| {batch}x{context} | {cell(res.get(now), nbytes)} | "
              f"{cell(res.get(best), nbytes)} {tuple(best) if best else ''} | "
              + " | ".join(cell(res.get(name), nbytes) for name in FLASHINFER) + " |")
    times = {shape: res for shape, (_, res) in results.items()}
    common = set.intersection(*({k for k in res if not isinstance(k, str)}
                                for res in times.values()))
    if not common:
        print(f"{kv}: no launch ran at every shape")
        return
    best_of = {shape: min(res[k] for k in common) for shape, res in times.items()}
    ratio = {k: [res[k] / best_of[s] for s, res in times.items()] for k in common}
    geo = {k: math.exp(sum(map(math.log, r)) / len(r)) for k, r in ratio.items()}
    pick = min(geo, key=geo.get)
    print(f"best over all shapes: LAUNCH[{KV_DTYPES[kv]}] = Launch{tuple(pick)}: "
          f"{geo[pick]:.3f}x each shape's best on average, {max(ratio[pick]):.3f}x at worst; "
          f"LAUNCH now {geo.get(now, float('nan')):.3f}x")


def grid(args, fp8: bool) -> list[Launch]:
    """The Launches to time: fp16 dots and register caps for FP8 only, the caps at 4 warps
    only (with 8 the compiler's choice is about 128 already)."""
    ints = [[int(x) for x in s.split(",")] for s in (args.block_t, args.warps, args.stages,
                                                     args.fp16_dots, args.max_registers)]
    return [Launch(block, warps, stages, bool(f16), regs)
            for block, warps, stages, f16, regs in itertools.product(*ints)
            if (fp8 or not (f16 or regs)) and (not regs or warps == 4)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv-dtype", default="bf16,fp8_e4m3", help="comma-separated: bf16, fp8_e4m3")
    p.add_argument("--layout", default="llama-3.1-8b", choices=list(LAYOUTS))
    p.add_argument("--cases", default=CASES, help="batch x context, comma-separated")
    p.add_argument("--block-t", default="64,128,256")
    p.add_argument("--warps", default="4,8")
    p.add_argument("--stages", default="2,3,4,6")
    p.add_argument("--fp16-dots", default="0,1", help="FP8: dots in bf16 (0), fp16 (1)")
    p.add_argument("--max-registers", default="0,128", help="FP8 with 4 warps: 0 = no cap")
    p.add_argument("--flashinfer", default=",".join(FLASHINFER),
                   help=f"FlashInfer's decodes to time, among {list(FLASHINFER)} ('' for none)")
    args = p.parse_args()
    kvs = args.kv_dtype.split(",")
    assert set(kvs) <= set(KV_DTYPES), f"--kv-dtype must be among {list(KV_DTYPES)}: {kvs}"
    args.flashinfer = [name for name in args.flashinfer.split(",") if name]
    assert set(args.flashinfer) <= set(FLASHINFER), f"--flashinfer: {args.flashinfer}"
    launches = {kv: grid(args, KV_DTYPES[kv] == FP8) for kv in kvs}
    shapes = [tuple(map(int, c.split("x"))) for c in args.cases.split(",")]
    failed = precompile(args.layout, launches, args.flashinfer)
    t0 = time.time()
    print("| shape | KV | kernel | block | warps | stages | us a layer | KV TB/s | error |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    results = {kv: {s: sweep_shape(*s, kv, args, launches[kv], failed) for s in shapes}
               for kv in kvs}
    print(f"timed in {time.time() - t0:.0f} s")
    for kv in kvs:
        summarize(kv, results[kv])


if __name__ == "__main__":
    main()
