"""The kernel choices a model is built with (the engine makes them before it builds the
model, so `models/llama.py` and the engine's construction say what runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (M, K), w (N, K)) -> (M, N)


@dataclass(frozen=True)
class Kernels:
    # FlashInfer's RMSNorm and SiLU-and-mul, and the fused qk-norm + RoPE + KV-store kernel
    # (attention/store.py) in the attention backend (CUDA, bf16/fp16); else torch ops.
    fused: bool = False
    # The matmul of every bias-free linear (gemm.Sm90Gemm's tuned CUTLASS-or-cuBLAS choice
    # on Hopper); None: F.linear (cuBLAS).
    gemm: Gemm | None = None
