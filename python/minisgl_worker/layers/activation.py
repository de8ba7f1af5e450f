from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """x: (T, 2 * I) holding [gate | up] -> (T, I) = silu(gate) * up. `fused`: FlashInfer's
    one-pass kernel (CUDA, bf16/fp16)."""
    if fused:
        from .cuda_ops import silu_and_mul as fused_silu_and_mul

        return fused_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
