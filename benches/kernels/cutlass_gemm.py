"""CUTLASS's SM90 GEMMs (TMA + wgmma, warp-specialized, persistent), with and without
programmatic dependent launch (PDL), against cuBLAS at decode-sized M: the worker's own
configurations (layers/gemm.py, gemm_sm90.cu; compiled as a FlashInfer JIT module).

cuBLAS cannot launch with PDL, and at Qwen3-0.6B's sizes its four GEMMs a layer take ~6 us
each for ~1-3 us of bytes (benches/RESULTS.md). CUTLASS's kernels can: launched with PDL, a
GEMM's set-up (barriers, TMA descriptors, the persistent scheduler) runs while the previous
kernel drains, and it waits on that kernel only before its first load. Most configurations
swap the operands (w on the tile's 128 or 64 rows, the batch on its 32-256 columns), as
vLLM and TensorRT-LLM do for small M.

    python benches/kernels/cutlass_gemm.py [--m 32,64,128,160,192,256] [--models qwen3-0.6b]

Prints, per shape and M, cuBLAS and the best configuration alone (weights cycled through
HBM, as gemm_small_m.py times them), and then the decoder layer chain without attention
(add-RMSNorm, qkv, o, add-RMSNorm, gate_up, SiLU, down; FlashInfer's norm and SiLU, which
launch with PDL) over all layers in one CUDA graph: cuBLAS, the best CUTLASS configurations,
the same launched with PDL, and "hybrid": CUTLASS with PDL except where cuBLAS alone is
faster by more than HYBRID_US."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from gemm_small_m import SHAPES, time_us, weight_copies
from minisgl_worker.layers import gemm
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import capture

DEV = torch.device("cuda")
BF16 = torch.bfloat16
HYBRID_US = gemm.PDL_CREDIT_US  # hybrid: cuBLAS where CUTLASS is slower by more than this
MODELS = {  # name: (hidden, intermediate, qkv out, attention out, layers)
    "qwen3-0.6b": (1024, 3072, 4096, 2048, 28),
    "llama8b": (4096, 14336, 6144, 4096, 32),
}


class Configs:
    """The worker's configurations (layers/gemm.py): name -> out = x @ w^T."""

    def __init__(self) -> None:
        from minisgl_worker.attention.flashinfer_jit import build_jit

        spec = gemm.jit_spec()
        build_jit([spec])
        self.module = spec.build_and_load()
        self.fns = {name: getattr(self.module, name) for name in gemm.CONFIGS}

    def run(self, name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
            pdl: bool = False) -> torch.Tensor:
        self.fns[name](x, w, out, pdl)
        return out


def best_configs(cfgs: Configs, shapes: list[str], ms: list[int]) -> dict:
    """(shape, M) -> (best config name, its us, cuBLAS us); prints a row for each."""
    print("| shape | M | cuBLAS us | best CUTLASS us | ratio | configuration | rel err |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    best = {}
    for shape in shapes:
        n, k = SHAPES[shape]
        weights = weight_copies(n, k)
        for m in ms:
            x = torch.randn(m, k, device=DEV, dtype=BF16)
            ref = F.linear(x, weights[0]).float()
            t_cublas = time_us(F.linear, weights, x)
            out = torch.empty(m, n, device=DEV, dtype=BF16)
            times, errs = {}, {}
            for name in cfgs.fns:
                got = cfgs.run(name, x, weights[0], out).float()
                errs[name] = ((got - ref).norm() / ref.norm()).item()
                assert errs[name] < 1e-2, (name, shape, m, errs[name])
                times[name] = time_us(lambda a, b, name=name, out=out: cfgs.run(name, a, b, out),
                                      weights, x)
            name = min(times, key=times.get)
            best[shape, m] = (name, times[name], t_cublas)
            print(f"| {shape} | {m} | {t_cublas:.1f} | {times[name]:.1f} | "
                  f"{t_cublas / times[name]:.2f}x | {name} | {errs[name]:.1e} |", flush=True)
        del weights
    return best


def chain_graph(dims: tuple[int, int, int, int], layers: list[dict], m: int, gemm):
    """One CUDA graph of `layers` (dicts of qkv, o, gate_up and down weights) without
    attention: add-RMSNorm, qkv, o, add-RMSNorm, gate_up, SiLU-and-mul, down, at batch `m`;
    `gemm(name, a, w, out)` writes out = a @ w^T. dims: (hidden, intermediate, qkv out,
    attention out)."""
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

    graph = capture(run)  # after a warm-up run (cuBLAS workspace, CUTLASS's first launch)
    graph.buffers = run  # the closure holds x, res, bufs, act: alive while the graph is
    return graph


def layer_chain(cfgs: Configs, model: str, layers: list[dict], m: int, mode: str,
                best: dict):
    """chain_graph of the model's layers; mode cublas, cutlass, cutlass-pdl (the
    best configuration per GEMM at this M) or hybrid-pdl."""

    def gemm(name: str, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        config, t_cutlass, t_cublas = best[f"{model}.{name}", m]
        if mode == "cublas" or (mode == "hybrid-pdl" and t_cutlass > t_cublas + HYBRID_US):
            torch.mm(a, w.t(), out=out)
        else:
            cfgs.run(config, a, w, out, pdl=mode != "cutlass")

    hidden, inter, qkv, attn_out, _ = MODELS[model]
    return chain_graph((hidden, inter, qkv, attn_out), layers, m, gemm)


def chains(cfgs: Configs, model: str, ms: list[int], best: dict) -> None:
    names = ("qkv", "o", "gate_up", "down")
    layers = [{name: torch.randn(*SHAPES[f"{model}.{name}"], device=DEV, dtype=BF16) * 0.02
               for name in names} for _ in range(MODELS[model][4])]
    print(f"\n{model}, {len(layers)} layers without attention, one CUDA graph")
    print("| M | cuBLAS ms | CUTLASS ms | CUTLASS + PDL ms | hybrid + PDL ms | "
          "CUTLASS + PDL, hybrid + PDL vs cuBLAS, us a layer |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in ms:
        t = {mode: do_bench(layer_chain(cfgs, model, layers, m, mode, best).replay,
                            warmup=10, rep=100, return_mode="median")
             for mode in ("cublas", "cutlass", "cutlass-pdl", "hybrid-pdl")}
        saved = [(t["cublas"] - t[mode]) * 1e3 / len(layers)
                 for mode in ("cutlass-pdl", "hybrid-pdl")]
        print(f"| {m} | {t['cublas']:.3f} | {t['cutlass']:.3f} | {t['cutlass-pdl']:.3f} | "
              f"{t['hybrid-pdl']:.3f} | {saved[0]:+.1f}, {saved[1]:+.1f} |", flush=True)
    del layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="32,64,128,160,192,256")
    p.add_argument("--models", default="qwen3-0.6b,llama8b")
    args = p.parse_args()
    torch.manual_seed(0)
    cfgs = Configs()
    ms = [int(v) for v in args.m.split(",")]
    models = args.models.split(",")
    shapes = [s for s in SHAPES if s.rsplit(".", 1)[0] in models]
    best = best_configs(cfgs, shapes, ms)
    for model in models:
        chains(cfgs, model, ms, best)


if __name__ == "__main__":
    main()
