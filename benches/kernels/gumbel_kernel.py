"""Time the one-pass Triton sampler (engine/gumbel.py) at the offline workload's batch sizes:

    python benches/kernels/gumbel_kernel.py

bf16 logits over Qwen3's vocabulary (151,936), temperature 0.6, CUDA-event medians of
`gumbel_sample` (the kernel and its small second pass over the row parts)."""

from __future__ import annotations

import argparse

import torch
from minisgl_worker.engine.gumbel import gumbel_sample
from triton.testing import do_bench

DEV = torch.device("cuda")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print("| rows | us | GB/s of logits |")
    print("| ---: | ---: | ---: |")
    for rows in (39, 153, 256):
        logits = (torch.randn(rows, 151_936, device=DEV) * 3).to(torch.bfloat16)
        temps = torch.full((rows,), 0.6, device=DEV)
        seeds = torch.arange(rows, device=DEV) * 7919 + 13
        ms = do_bench(lambda: gumbel_sample(logits, temps, seeds), warmup=25, rep=200,  # noqa: B023
                      return_mode="median")
        print(f"| {rows} | {1e3 * ms:.1f} | {logits.numel() * 2 / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
