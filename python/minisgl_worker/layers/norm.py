from __future__ import annotations

import torch
from torch import nn

from . import cuda_ops


class RMSNorm(nn.Module):
    """Torch-native, or FlashInfer's kernels when `fused` (CUDA, bf16/fp16), the add-and-norm
    one in place."""

    def __init__(self, size: int, eps: float, fused: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))
        self.fused = fused

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 like the reference implementation, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return cuda_ops.rmsnorm(x, self.weight, self.eps)
        return self._norm(x)

    def forward_add(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused-add signature: returns (norm(x + residual), x + residual). The fused path
        overwrites x and residual (both fresh activations owned by the caller)."""
        if self.fused:
            if residual is None:
                return cuda_ops.rmsnorm(x, self.weight, self.eps), x
            cuda_ops.fused_add_rmsnorm(x, residual, self.weight, self.eps)
            return x, residual
        if residual is not None:
            x = x + residual
        return self._norm(x), x
