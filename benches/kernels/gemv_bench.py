"""Our decode-batch GEMM (layers/gemv.py, gemv_sm90.cu) against cuBLAS at M <= 16, in real
model shapes, on Hopper.

    python benches/kernels/gemv_bench.py [--m 1,4,8,16] [--models llama8b,qwen3-0.6b]

1. Each GEMM alone (weights cycled through HBM in a CUDA graph, gemm_small_m.py's timer):
   cuBLAS and every gemv configuration, us and weight-read TB/s; the best is checked against
   F.linear. gate_up also fused with SiLU-and-mul, against cuBLAS + FlashInfer's silu_and_mul.
2. The model's layers without attention in one CUDA graph (cutlass_gemm.py's chain: add-
   RMSNorm, qkv, o, add-RMSNorm, gate_up, SiLU-and-mul, down): cuBLAS; the best gemv
   configuration per GEMM where it beats cuBLAS alone (launched with PDL); the same with
   gate_up's SiLU-and-mul fused where that is faster. ms a step and us saved a layer."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cutlass_gemm import MODELS
from gemm_small_m import SHAPES, time_us, weight_copies
from minisgl_worker.layers import gemv
from triton.testing import do_bench

DEV = torch.device("cuda")
BF16 = torch.bfloat16


def module() -> object:
    from minisgl_worker.attention.flashinfer_jit import build_jit

    spec = gemv.jit_spec()
    build_jit([spec])
    return spec.build_and_load()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert not got.isnan().any()
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def silu_and_mul(y: torch.Tensor) -> torch.Tensor:
    import flashinfer

    return flashinfer.activation.silu_and_mul(y)


def best_alone(mod: object, shapes: list[str], ms: list[int]) -> dict:
    """(shape, M) -> (best plain config, its us, cuBLAS us); (shape + '.silu', M) -> (best
    SiLU config, its us, cuBLAS + silu_and_mul us). Prints a row for each."""
    print("| shape | M | cuBLAS us (TB/s) | best gemv us (TB/s) | ratio | configuration | "
          "rel err |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    best = {}
    for shape in shapes:
        n, k = SHAPES[shape]
        weights, tbs = weight_copies(n, k), lambda us, n=n, k=k: n * k * 2 / us / 1e6
        for m in ms:
            x = torch.randn(m, k, device=DEV, dtype=BF16)
            rows = [("", gemv.PLAIN, lambda a, b: F.linear(a, b), F.linear)]
            if shape.endswith("gate_up"):
                rows.append((".silu", gemv.SILU, lambda a, b: silu_and_mul(F.linear(a, b)),
                             lambda a, b: silu_and_mul(F.linear(a, b))))
            for suffix, configs, ref_fn, base_fn in rows:
                ref = ref_fn(x, weights[0])
                t_base = time_us(base_fn, weights, x)
                times, errs = {}, {}
                for name in configs:
                    if not gemv.fits(name, m, n, k):
                        continue
                    errs[name] = rel_err(gemv.run(mod, name, x, weights[0]), ref)
                    assert errs[name] < 1e-2, (name, shape, m, errs[name])
                    times[name] = time_us(lambda a, b, name=name: gemv.run(mod, name, a, b),
                                          weights, x)
                name = min(times, key=times.__getitem__)
                best[shape + suffix, m] = (name, times[name], t_base)
                print(f"| {shape}{suffix} | {m} | {t_base:.1f} ({tbs(t_base):.2f}) | "
                      f"{times[name]:.1f} ({tbs(times[name]):.2f}) | "
                      f"{t_base / times[name]:.2f}x | {name} | {errs[name]:.1e} |", flush=True)
        del weights
    return best


def chain(model: str, layers: list[dict], m: int, mod: object, best: dict,
          mode: str) -> torch.cuda.CUDAGraph:
    """The layers without attention in one graph; mode: cublas, gemv, gemv-silu."""
    import flashinfer
    from common import capture

    hidden, _, _, attn_out, _ = MODELS[model]
    x = torch.randn(m, hidden, device=DEV, dtype=BF16)
    res, nw = torch.randn_like(x), torch.ones(hidden, device=DEV, dtype=BF16)
    attn = torch.randn(m, attn_out, device=DEV, dtype=BF16)  # attention's output stand-in

    def gemm(name: str, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        config, t_ours, t_cublas = best[f"{model}.{name}", m]
        if mode == "cublas" or t_ours >= t_cublas:
            return F.linear(a, w)
        return gemv.run(mod, config, a, w)

    def run() -> None:
        for layer in layers:
            flashinfer.norm.fused_add_rmsnorm(x, res, nw, 1e-6)
            gemm("qkv", x, layer["qkv"])
            o = gemm("o", attn, layer["o"])
            flashinfer.norm.fused_add_rmsnorm(o, res, nw, 1e-6)
            config, t_fused, t_unfused = best[f"{model}.gate_up.silu", m]
            if mode == "gemv-silu" and t_fused < t_unfused:
                act = gemv.run(mod, config, o, layer["gate_up"])
            else:
                act = silu_and_mul(gemm("gate_up", o, layer["gate_up"]))
            gemm("down", act, layer["down"])

    graph = capture(run)
    graph.buffers = run  # the closure's tensors live as long as the graph
    return graph


def chains(mod: object, model: str, ms: list[int], best: dict) -> None:
    names = ("qkv", "o", "gate_up", "down")
    layers = [{name: torch.randn(*SHAPES[f"{model}.{name}"], device=DEV, dtype=BF16) * 0.02
               for name in names} for _ in range(MODELS[model][4])]
    print(f"\n{model}, {len(layers)} layers without attention, one CUDA graph")
    print("| M | cuBLAS ms | gemv ms | gemv + fused SiLU ms | us saved a layer (gemv, fused) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for m in ms:
        t = {mode: do_bench(chain(model, layers, m, mod, best, mode).replay, warmup=10,
                            rep=100, return_mode="median")
             for mode in ("cublas", "gemv", "gemv-silu")}
        saved = [(t["cublas"] - t[mode]) * 1e3 / len(layers) for mode in ("gemv", "gemv-silu")]
        print(f"| {m} | {t['cublas']:.3f} | {t['gemv']:.3f} | {t['gemv-silu']:.3f} | "
              f"{saved[0]:+.1f}, {saved[1]:+.1f} |", flush=True)
    del layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="1,4,8,16")
    p.add_argument("--models", default="llama8b,qwen3-0.6b")
    args = p.parse_args()
    torch.manual_seed(0)
    mod = module()
    ms = [int(v) for v in args.m.split(",")]
    models = args.models.split(",")
    best = best_alone(mod, [s for s in SHAPES if s.rsplit(".", 1)[0] in models], ms)
    for model in models:
        chains(mod, model, ms, best)


if __name__ == "__main__":
    main()
