"""Decode-sized GEMMs (M <= 256 tokens) in real model shapes: cuBLAS (F.linear) against a
plain Triton GEMM (below: one (M-block, N-block) tile per program, the K loop optionally
split over `split` programs with fp32 partials summed by a second kernel) over a grid of
tiles. Each call is timed inside a CUDA graph over enough weight copies (>= 512 MB) that
the weight comes from HBM, not L2, as it does layer after layer in a decode step.

    python benches/kernels/gemm_small_m.py --json tiles.json
    python benches/kernels/gemm_small_m.py --cublas-scan --m 1,2,4,8,16,24  # cuBLAS alone, by M

Prints per shape and M: microseconds and weight-streaming TB/s for each, and the best tile.
Result on the H200 (benches/RESULTS.md): cuBLAS is as fast or faster than these Triton tiles
at every M that matters. cutlass_gemm.py times its GEMMs with this file's helpers."""

from __future__ import annotations

import argparse
import itertools
import json
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


class Tile(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    split: int
    stages: int
    warps: int


@triton.jit
def _mm(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, k_per_split,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PARTIAL: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None] * K + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        a = tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0)
        b = tl.load(w_ptrs)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = out_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    mask = offs_m[:, None] < M
    if PARTIAL:
        tl.store(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_partials(part_ptr, out_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def fits(x: torch.Tensor, w: torch.Tensor, tile: Tile) -> bool:
    n, k = w.shape
    return (x.stride(-1) == 1 and w.is_contiguous() and n % tile.block_n == 0
            and k % (tile.split * tile.block_k) == 0)


def skinny_mm(x: torch.Tensor, w: torch.Tensor, tile: Tile) -> torch.Tensor:
    """x (M, K) with unit stride in K, w (N, K) contiguous; `fits(x, w, tile)` must hold."""
    m, k = x.shape
    n = w.shape[0]
    assert fits(x, w, tile), (tuple(x.shape), tuple(w.shape), tile)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (n // tile.block_n, triton.cdiv(m, tile.block_m), tile.split)
    dst = out if tile.split == 1 else torch.empty(tile.split, m, n, dtype=torch.float32,
                                                  device=x.device)
    _mm[grid](x, w, dst, m, n, k, x.stride(0), k // tile.split,
              BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
              PARTIAL=tile.split > 1, num_stages=tile.stages, num_warps=tile.warps)
    if tile.split > 1:
        block = 1024
        _sum_partials[(triton.cdiv(m * n, block),)](dst, out, m * n, SPLIT=tile.split,
                                                    BLOCK=block, num_warps=4)
    return out

SHAPES = {  # name: (N, K)
    "llama8b.qkv": (6144, 4096), "llama8b.o": (4096, 4096),
    "llama8b.gate_up": (28672, 4096), "llama8b.down": (4096, 14336),
    "qwen3-0.6b.qkv": (4096, 1024), "qwen3-0.6b.o": (1024, 2048),
    "qwen3-0.6b.gate_up": (6144, 1024), "qwen3-0.6b.down": (1024, 3072),
}


def time_us(fn, weights, x, calls: int = 20, replays: int = 5) -> float:
    for w in weights[:2]:
        fn(x, w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def tiles(m: int):
    for bm, bn, bk, split in itertools.product((64, 128, 256), (64, 128), (64, 128), (1, 2, 4)):
        if bm > max(64, triton_pow2(m)):
            continue
        stages = min(5, 200 * 1024 // ((bm + bn) * bk * 2))  # as many as shared memory holds
        yield Tile(bm, bn, bk, split, stages, 4 if bm * bn <= 8192 else 8)


def triton_pow2(m: int) -> int:
    return 1 << (m - 1).bit_length()


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Enough (N, K) bf16 weights (>= 512 MB, at least 2) that cycling through them in
    `time_us` reads each from HBM, not L2."""
    count = max(2, -(-512 * 2**20 // (n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            for _ in range(count)]


def cases(args: argparse.Namespace):
    """(shape name, M, weight bytes, the weight copies, an (M, K) input) for every shape and
    M asked for; one shape's weights at a time."""
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        weights = weight_copies(n, k)
        for m in map(int, args.m.split(",")):
            yield name, m, n * k * 2, weights, torch.randn(m, k, device="cuda",
                                                           dtype=torch.bfloat16)
        del weights


def tunable_vs_default(args: argparse.Namespace) -> None:
    """Each shape and M: F.linear's default cuBLAS kernel, then TunableOp's pick among the
    default and cuBLASLt's 8 best heuristics (tuned over a rotating buffer larger than L2,
    so the candidates read their weights from HBM), timed the same way."""
    from torch.cuda import tunable

    tunable.set_rotating_buffer_size(256)  # MB
    tunable.set_max_tuning_iterations(100)
    print(f"{'shape':20s} {'M':>4s} {'default us':>10s} {'TB/s':>6s} {'tuned us':>10s} "
          f"{'TB/s':>6s} {'gain':>6s}")
    for name, m, nbytes, weights, x in cases(args):
        tunable.enable(False)
        t_default = time_us(F.linear, weights, x)
        tunable.enable(True)
        tunable.tuning_enable(True)
        F.linear(x, weights[0])  # tunes this shape
        tunable.tuning_enable(False)
        t_tuned = time_us(F.linear, weights, x)
        tunable.enable(False)
        print(f"{name:20s} {m:4d} {t_default:10.1f} {nbytes / t_default / 1e6:6.2f} "
              f"{t_tuned:10.1f} {nbytes / t_tuned / 1e6:6.2f} {t_default / t_tuned:5.2f}x",
              flush=True)
    for result in tunable.get_results():
        print("tuned:", *result)


def cublas_scan(args: argparse.Namespace) -> None:
    """cuBLAS alone at every M asked for, and per model the sum of its four decode GEMMs a
    layer; flags each M that costs more than a larger one (a batch padded up to that M would
    run its GEMMs faster), which is what the decode graphs' batch sizes should avoid."""
    per_model: dict[str, dict[int, float]] = {}
    for name, m, nbytes, weights, x in cases(args):
        t = time_us(F.linear, weights, x)
        by_m = per_model.setdefault(name.rsplit(".", 1)[0], {})  # "qwen3-0.6b.qkv" -> "qwen3-0.6b"
        by_m[m] = by_m.get(m, 0.0) + t
        print(f"{name:20s} {m:4d} {t:8.2f} us {nbytes / t / 1e6:6.2f} TB/s", flush=True)
    for model, by_m in per_model.items():
        ms = sorted(by_m)
        print(f"{model}: four GEMMs a layer, us by M")
        for i, m in enumerate(ms):
            cheaper = [n for n in ms[i + 1:] if by_m[n] < by_m[m]]
            note = f"  <- M = {cheaper[0]} is faster ({by_m[cheaper[0]]:.2f})" if cheaper else ""
            print(f"  {m:4d} {by_m[m]:8.2f}{note}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="16,64,128,192,256")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--json")
    p.add_argument("--tunable", action="store_true",
                   help="cuBLAS's default against the best of cuBLASLt's top heuristics, as "
                   "picked by PyTorch's TunableOp (instead of the Triton tiles)")
    p.add_argument("--cublas-scan", action="store_true",
                   help="cuBLAS alone, and per model the four GEMMs' sum by M, flagging an M "
                   "slower than a larger one")
    args = p.parse_args()
    torch.manual_seed(0)
    if args.cublas_scan:
        cublas_scan(args)
        return
    if args.tunable:
        tunable_vs_default(args)
        return
    best_tiles = {}
    print(f"{'shape':20s} {'M':>4s} {'cuBLAS us':>10s} {'TB/s':>6s} {'triton us':>10s} "
          f"{'TB/s':>6s} {'gain':>6s}  tile")
    for name, m, nbytes, weights, x in cases(args):
        ref = F.linear(x, weights[0]).float()
        t_cublas = time_us(F.linear, weights, x)
        best = (float("inf"), None)
        for tile in tiles(m):
            if not fits(x, weights[0], tile):
                continue
            try:
                out = skinny_mm(x, weights[0], tile).float()
                err = ((out - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (tile, err)
                t = time_us(lambda a, b, tile=tile: skinny_mm(a, b, tile), weights, x)
            except triton.runtime.errors.OutOfResources:
                continue
            best = min(best, (t, tile), key=lambda r: r[0])
        t, tile = best
        print(f"{name:20s} {m:4d} {t_cublas:10.1f} {nbytes / t_cublas / 1e6:6.2f} "
              f"{t:10.1f} {nbytes / t / 1e6:6.2f} {t_cublas / t:5.2f}x  {tuple(tile)}",
              flush=True)
        n, k = SHAPES[name]
        best_tiles[f"{n}x{k}/{m}"] = {"cublas_us": round(t_cublas, 2),
                                      "triton_us": round(t, 2), "tile": list(tile)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(best_tiles, f, indent=1)


if __name__ == "__main__":
    main()
