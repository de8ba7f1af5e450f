"""Would torch.compile (Inductor) run Qwen3-0.6B's decode layers faster than the worker's
kernels? The worker runs a decode layer as FlashInfer add-RMSNorm, cuBLAS GEMMs and
FlashInfer SiLU-and-mul: nine launches a layer, each of the four GEMMs ~6 us for ~2 us of
bytes (RESULTS.md, "A decode step decomposed"). Inductor would fuse the norms and the
activation into its own Triton kernels and, with max-autotune, time Triton GEMM templates
(which can take a pointwise prologue or epilogue) against cuBLAS per shape.

The stand-in is pdl_gemm.py's: the layer chain without attention (add-RMSNorm, qkv, o from
a stand-in attention output, add-RMSNorm, gate_up, SiLU-and-mul, down) over 28 layers of
distinct weights, one CUDA graph per setting, replayed and timed:

- worker: FlashInfer + cuBLAS, as the worker runs it (`worker_layer`);
- eager: the same math in torch ops (`layer`), uncompiled;
- compiled, default: `torch.compile(layer)` (one graph for a layer, reused by all 28);
- compiled, max-autotune: mode "max-autotune-no-cudagraphs" (Triton GEMM templates tried
  against cuBLAS for each shape and M; the CUDA graph is ours).

    python benches/compile_chain.py [--m 32,160,256] [--modes default,max-autotune]  # GPU
    python benches/compile_chain.py --check   # CPU: the compiled layer against eager
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

HIDDEN, INTER, QKV, ATTN_OUT = 1024, 3072, 4096, 2048
LAYERS, EPS = 28, 1e-6
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, ATTN_OUT), "gate_up": (2 * INTER, HIDDEN),
          "down": (HIDDEN, INTER)}


def layer(x, res, attn, norm_w, qkv_w, o_w, gate_up_w, down_w):
    """One decode layer without attention, in torch ops -> (next x, next residual, qkv)."""
    def add_rmsnorm(h, r):
        s = h + r
        sf = s.float()
        return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + EPS)).to(h.dtype) * norm_w, s

    h, res = add_rmsnorm(x, res)
    qkv = h @ qkv_w.t()  # feeds attention in the model; here returned so it is computed
    h, res = add_rmsnorm(attn @ o_w.t(), res)
    gate, up = (h @ gate_up_w.t()).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down_w.t(), res, qkv


def worker_layer(x, res, attn, norm_w, qkv_w, o_w, gate_up_w, down_w):
    """`layer` as the worker runs it: FlashInfer add-RMSNorm (in place) and SiLU-and-mul,
    cuBLAS GEMMs."""
    import flashinfer

    flashinfer.norm.fused_add_rmsnorm(x, res, norm_w, EPS)
    qkv = x @ qkv_w.t()
    h = attn @ o_w.t()
    flashinfer.norm.fused_add_rmsnorm(h, res, norm_w, EPS)
    return flashinfer.activation.silu_and_mul(h @ gate_up_w.t()) @ down_w.t(), res, qkv


def weights(device, dtype, layers: int = LAYERS) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.randn(*s, device=device, dtype=dtype) * 0.02 for k, s in SHAPES.items()}
            for _ in range(layers)]


def chain(fn, layers, m: int, device, dtype):
    """A closure running `fn` over every layer on fixed buffers (graph-capturable), and the
    tensors it writes (the last layer's outputs)."""
    x = torch.randn(m, HIDDEN, device=device, dtype=dtype)
    res = torch.randn_like(x)
    attn = torch.randn(m, ATTN_OUT, device=device, dtype=dtype)
    norm_w = torch.ones(HIDDEN, device=device, dtype=dtype)
    outs: dict[str, torch.Tensor] = {}

    def run() -> None:
        h, r = x, res
        for w in layers:
            h, r, qkv = fn(h, r, attn, norm_w, w["qkv"], w["o"], w["gate_up"], w["down"])
        outs.update(x=h, res=r, qkv=qkv)

    return run, outs


def compiled(mode: str):
    import torch._dynamo

    torch._dynamo.reset()
    if mode == "default":
        return torch.compile(layer, dynamic=False)
    return torch.compile(layer, mode="max-autotune-no-cudagraphs", dynamic=False)


def check() -> None:
    """On CPU (float32, 2 layers): the compiled layer chain gives the eager chain's output."""
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    layers = weights(cpu, torch.float32, layers=2)
    results = []
    for fn in (layer, compiled("default")):
        torch.manual_seed(1)  # the same inputs for both chains
        run, outs = chain(fn, layers, 8, cpu, torch.float32)
        run()
        results.append(outs)
    eager, got = results
    for name in ("x", "res", "qkv"):
        err = ((got[name] - eager[name]).abs().max() / eager[name].abs().max()).item()
        print(f"{name}: relative error {err:.1e}")
        assert err < 1e-4, (name, err)


def bench(ms: list[int], modes: list[str]) -> None:
    from stream_overlap import capture
    from triton.testing import do_bench

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    layers = weights(dev, bf16)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| M | setting | ms a chain (28 layers) | us a layer | vs worker | compile s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for m in ms:
        rows = []  # (name, graph, the closure holding the graph's input buffers, compile s)
        settings = [("worker (FlashInfer + cuBLAS)", worker_layer), ("eager torch ops", layer)]
        settings += [(f"compiled, {mode}", mode) for mode in modes]
        for name, fn in settings:
            t0 = time.perf_counter()
            fn = fn if callable(fn) else compiled(fn)
            run, _ = chain(fn, layers, m, dev, bf16)
            run()  # compiles (and autotunes) outside the capture
            torch.cuda.synchronize()
            rows.append((name, capture(run), run, time.perf_counter() - t0))
        base = None
        for name, graph, _, compile_s in rows:
            t = do_bench(graph.replay, warmup=10, rep=100, return_mode="median")
            base = base or t
            print(f"| {m} | {name} | {t:.3f} | {1e3 * t / LAYERS:.1f} | {base / t:.2f}x | "
                  f"{compile_s:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="32,160,256")
    p.add_argument("--modes", default="default,max-autotune")
    p.add_argument("--check", action="store_true", help="CPU: compiled against eager")
    args = p.parse_args()
    if args.check:
        check()
    else:
        bench([int(v) for v in args.m.split(",")], args.modes.split(","))


if __name__ == "__main__":
    main()
