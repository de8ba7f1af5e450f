"""Would Qwen3-0.6B's decode GEMMs run faster with their weights already in L2?

A decode step's GEMMs take ~26 us a layer for 31.5 MB of weights (1.2 TB/s): each of the
four is a ~6 us kernel, latency-bound. One layer's weights fit in an H200's 50 MB L2. This
bench times a stand-in for a decode step (per layer: the qkv GEMM, a read-only kernel over
`--kv-mb` MB standing for attention's KV reads, then the o, gate_up and down GEMMs), all
in one CUDA graph, in three variants:

- cold: every layer has its own weights (28 x 31.5 MB, so each GEMM reads HBM);
- prefetch: the same, plus a second stream that, while the attention stand-in runs, reads
  the layer's o/gate_up/down weights and the next layer's qkv weight with evict_last, so
  the GEMMs after it find them in L2;
- hot: all layers share one set of weights (the L2 bound).

Usage: python benches/l2_prefetch.py [--m 32,160,256] [--kv-mb 573]"""

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
HIDDEN, INTER, QKV = 1024, 3072, 4096  # Qwen3-0.6B: q 16 x 128, k and v 8 x 128
LAYERS = 28


@triton.jit
def _touch_kernel(ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Read n elements at ptr into L2 (evict_last); one partial sum per program keeps the
    loads alive."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(ptr + offs, mask=offs < n, other=0.0,
                       eviction_policy="evict_last").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


class Layer:
    """One layer's four weights as views of one flat buffer (so one touch covers them)."""

    def __init__(self) -> None:
        sizes = [QKV * HIDDEN, HIDDEN * 2048, 2 * INTER * HIDDEN, HIDDEN * INTER]
        self.flat = torch.randn(sum(sizes), device=DEV, dtype=BF16) * 0.02
        qkv, o, gate_up, down = self.flat.split(sizes)
        self.qkv = qkv.view(QKV, HIDDEN)
        self.o = o.view(HIDDEN, 2048)
        self.gate_up = gate_up.view(2 * INTER, HIDDEN)
        self.down = down.view(HIDDEN, INTER)
        self.after_qkv = self.flat[sizes[0]:]  # o, gate_up, down


def step_graph(layers: list[Layer], m: int, kv: torch.Tensor, prefetch: bool,
               with_attention: bool = True) -> torch.cuda.CUDAGraph:
    x = torch.randn(m, HIDDEN, device=DEV, dtype=BF16)
    a = torch.randn(m, 2048, device=DEV, dtype=BF16)
    h = torch.randn(m, INTER, device=DEV, dtype=BF16)
    sums = torch.empty(264, device=DEV, dtype=torch.float32)
    side = torch.cuda.Stream(DEV)

    def touch(t: torch.Tensor) -> None:
        _touch_kernel[(264,)](t, sums, t.numel(), BLOCK=2048, num_warps=4)

    def run() -> None:
        for i, layer in enumerate(layers):
            F.linear(x, layer.qkv)
            if prefetch:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    touch(layer.after_qkv)
                    touch(layers[(i + 1) % len(layers)].qkv)
            if with_attention:
                kv.sum(dtype=torch.float32)
            F.linear(a, layer.o)
            F.linear(x, layer.gate_up)
            F.linear(h, layer.down)
            if prefetch:
                torch.cuda.current_stream().wait_stream(side)

    return capture(run)  # after a warm-up run (cuBLAS workspace, Triton compiles)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="32,160,256", help="decode batch sizes")
    p.add_argument("--kv-mb", type=int, default=573, help="attention stand-in's bytes a layer")
    args = p.parse_args()
    cold = [Layer() for _ in range(LAYERS)]
    hot = [cold[0]] * LAYERS
    kv = torch.randn(args.kv_mb << 19, device=DEV, dtype=BF16)  # MB / 2 bytes
    print("| M | attention stand-in | cold ms | prefetch ms | hot ms | prefetch saves us/layer |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for m in (int(v) for v in args.m.split(",")):
        for attn in (False, True):
            t = {}
            for name, layers, pre in (("cold", cold, False), ("prefetch", cold, True),
                                      ("hot", hot, False)):
                g = step_graph(layers, m, kv, pre, attn)
                t[name] = do_bench(g.replay, warmup=10, rep=100, return_mode="median")
            saved = (t["cold"] - t["prefetch"]) * 1e3 / LAYERS
            print(f"| {m} | {f'{args.kv_mb} MB read' if attn else 'none'} | {t['cold']:.3f} | "
                  f"{t['prefetch']:.3f} | {t['hot']:.3f} | {saved:.1f} |")


if __name__ == "__main__":
    main()
