"""FlashInfer-backed fused ops for the CUDA path (the math of the torch-native layers
`norm.py` and `activation.py`; tests/gpu/test_cuda_ops.py compares them). flashinfer is
imported inside each op, so importing this module is free on CPU. Inputs are bf16/fp16 CUDA
tensors; weights are in the input's dtype. Each kernel computes in fp32 and rounds once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x (T, H) or (T, heads, D) (per-head qk-norm; strided rows allowed) -> same shape."""
    from flashinfer.norm import rmsnorm as fi_rmsnorm

    return fi_rmsnorm(x, weight, eps, out=out)


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place, both (T, H): residual <- x + residual; x <- rmsnorm(residual). So `x, residual`
    afterwards are what `RMSNorm.forward_add(x, residual)` returns."""
    from flashinfer.norm import fused_add_rmsnorm as fi_fused_add_rmsnorm

    fi_fused_add_rmsnorm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, 2I) holding [gate | up] -> (T, I) = silu(gate) * up."""
    from flashinfer.activation import silu_and_mul as fi_silu_and_mul

    return fi_silu_and_mul(x, out=out)


def jit_specs() -> list[JitSpec]:
    """The FlashInfer JIT modules the ops above use (norm, silu_and_mul)."""
    from flashinfer.jit import gen_act_and_mul_module
    from flashinfer.jit.norm import gen_norm_module

    return [gen_norm_module(), gen_act_and_mul_module("silu")]
