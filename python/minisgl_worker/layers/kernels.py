"""The kernel choices a model is built with (the engine makes them before it builds the
model, so `models/llama.py` and the engine's construction say what runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (M, K), w (N, K)) -> (M, N)
# (x (M, K), [gate | up] w (2I, K)) -> silu(gate) * up (M, I), or None where not fused
GemmSilu = Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]


@dataclass(frozen=True)
class Kernels:
    # FlashInfer's RMSNorm and SiLU-and-mul, and the fused qk-norm + RoPE + KV-store kernel
    # (attention/store.py) in the attention backend (CUDA, bf16/fp16); else torch ops.
    fused: bool = False
    # The matmul of every bias-free linear (gemm.Sm90Gemm's tuned choice of cuBLAS, CUTLASS
    # or gemv on Hopper); None: F.linear (cuBLAS).
    gemm: Gemm | None = None
    # gate_up's GEMM with SiLU-and-mul in one kernel where that was timed faster (gemm.py);
    # None: the GEMM, then SiLU-and-mul.
    gemm_silu: GemmSilu | None = None
