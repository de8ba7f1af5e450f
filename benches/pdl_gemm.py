"""Can programmatic dependent launch (PDL) hide the latency of Qwen3-0.6B's decode GEMMs?

Each of a decode layer's four GEMMs takes ~6 us at any batch size for ~2 us of bytes
(benches/RESULTS.md, "A decode step decomposed"). This bench times a stand-in for the layer
chain without attention (add-RMSNorm, qkv, o, add-RMSNorm, gate_up, SiLU-and-mul, down;
FlashInfer's norm and activation kernels, which launch with PDL on SM90) over 28 layers of
distinct weights in one CUDA graph, with the GEMMs done by:

- cublas: F.linear, what the worker runs;
- triton: a plain Triton GEMM (tile chosen per shape from a few): gemm_small_m.py's `_mm`
  without split-K, kept separate because the PDL variant below changes its prologue;
- triton-pdl: the same kernel launched with PDL: its programs start while the previous
  kernel drains, load their first weight tile, then wait (griddepcontrol.wait) before
  reading the activations, and let the next kernel launch early.

Usage: python benches/pdl_gemm.py [--m 32,160,256]"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from stream_overlap import capture
from triton.testing import do_bench

DEV = torch.device("cuda")
BF16 = torch.bfloat16
HIDDEN, INTER, QKV, ATTN_OUT = 1024, 3072, 4096, 2048
LAYERS = 28
TILES = [(16, 64, 128), (32, 64, 128), (64, 64, 64), (64, 128, 64), (32, 32, 256)]


@triton.jit
def _gemm_kernel(a_ptr, w_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, PDL: tl.constexpr):
    """out (M, N) = a (M, K) @ w (N, K)^T, all row-major, fp32 accumulation."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    w_tile = w_ptr + rn[None, :] * K + rk[:, None]  # (BK, BN) view of w^T
    a_tile = a_ptr + rm[:, None] * K + rk[None, :]
    w_first = tl.load(w_tile, mask=rn[None, :] < N, other=0.0)  # weights: no dependency
    if PDL:
        tl.extra.cuda.gdc_wait()  # the activations are the previous kernel's output
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.dot(tl.load(a_tile, mask=rm[:, None] < M, other=0.0), w_first,
                 out_dtype=tl.float32)
    for k in range(BK, K, BK):
        a = tl.load(a_tile + k, mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_tile + k, mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, w, acc, out_dtype=tl.float32)
    out = out_ptr + rm[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_linear(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: tuple, pdl: bool):
    m, k = a.shape
    n = w.shape[0]
    bm, bn, bk = tile
    _gemm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
        a, w, out, m, n, k, BM=bm, BN=bn, BK=bk, PDL=pdl, num_warps=4, num_stages=4,
        launch_pdl=pdl)


def tile_us(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: tuple) -> float:
    return do_bench(lambda: triton_linear(a, w, out, tile, False), warmup=5, rep=30)


def best_tiles(m: int, weights: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """Per GEMM, the fastest tile (weights cycled, so each call reads HBM)."""
    best = {}
    for name, w in weights.items():
        a = torch.randn(m, w.shape[1], device=DEV, dtype=BF16)
        out = torch.empty(m, w.shape[0], device=DEV, dtype=BF16)
        times = {t: tile_us(a, w, out, t) for t in TILES}
        best[name] = min(times, key=times.get)
        err = (out.float() - F.linear(a, w).float()).abs().max().item()
        assert err < 0.1, (name, err)
    return best


def chain_graph(dims: tuple[int, int, int, int], layers: list[dict], m: int, gemm):
    """One CUDA graph of `layers` (dicts of qkv, o, gate_up and down weights) without
    attention: add-RMSNorm, qkv, o, add-RMSNorm, gate_up, SiLU-and-mul, down, at batch `m`;
    `gemm(name, a, w, out)` writes out = a @ w^T. dims: (hidden, intermediate, qkv out,
    attention out). Also used by cutlass_gemm.py."""
    import flashinfer

    hidden, inter, qkv, attn_out = dims
    x = torch.randn(m, hidden, device=DEV, dtype=BF16)
    res = torch.randn_like(x)
    nw = torch.ones(hidden, device=DEV, dtype=BF16)
    bufs = {"qkv": torch.empty(m, qkv, device=DEV, dtype=BF16),
            "o": torch.empty(m, hidden, device=DEV, dtype=BF16),
            "gate_up": torch.empty(m, 2 * inter, device=DEV, dtype=BF16),
            "down": torch.empty(m, hidden, device=DEV, dtype=BF16)}
    attn = torch.randn(m, attn_out, device=DEV, dtype=BF16)  # attention's output stand-in
    act = torch.empty(m, inter, device=DEV, dtype=BF16)

    def run() -> None:
        for layer in layers:
            flashinfer.norm.fused_add_rmsnorm(x, res, nw, 1e-6)
            gemm("qkv", x, layer["qkv"], bufs["qkv"])
            gemm("o", attn, layer["o"], bufs["o"])
            flashinfer.norm.fused_add_rmsnorm(bufs["o"], res, nw, 1e-6)
            gemm("gate_up", bufs["o"], layer["gate_up"], bufs["gate_up"])
            flashinfer.activation.silu_and_mul(bufs["gate_up"], out=act)
            gemm("down", act, layer["down"], bufs["down"])

    graph = capture(run)  # after a warm-up run (cuBLAS workspace, Triton compiles)
    graph.buffers = run  # the closure holds x, res, bufs, act: alive while the graph is
    return graph


def layer_chain(layers: list[dict], m: int, mode: str, tiles: dict[str, tuple]):
    def gemm(name: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        if mode == "cublas":
            torch.mm(a, w.t(), out=out)
        else:
            triton_linear(a, w, out, tiles[name], mode == "triton-pdl")

    return chain_graph((HIDDEN, INTER, QKV, ATTN_OUT), layers, m, gemm)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="32,160,256")
    args = p.parse_args()
    shapes = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, ATTN_OUT), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER)}
    layers = [{k: torch.randn(*s, device=DEV, dtype=BF16) * 0.02 for k, s in shapes.items()}
              for _ in range(LAYERS)]
    print("| M | cublas ms | triton ms | triton-pdl ms | pdl vs cublas us/layer | tiles |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for m in (int(v) for v in args.m.split(",")):
        tiles = best_tiles(m, layers[0])
        t = {}
        for mode in ("cublas", "triton", "triton-pdl"):
            try:
                t[mode] = do_bench(layer_chain(layers, m, mode, tiles).replay, warmup=10,
                                   rep=100, return_mode="median")
            except (TypeError, KeyError, RuntimeError) as e:  # e.g. no launch_pdl
                print(f"{mode} at M={m}: {type(e).__name__}: {e}")
                t[mode] = float("nan")
        saved = (t["cublas"] - t["triton-pdl"]) * 1e3 / LAYERS
        print(f"| {m} | {t['cublas']:.3f} | {t['triton']:.3f} | {t['triton-pdl']:.3f} | "
              f"{saved:+.1f} | {tiles} |")


if __name__ == "__main__":
    main()
