"""FlashInfer-backed fused ops for the CUDA path, each beside a torch reference with the math
of the torch-native layers (`norm.py`, `rotary.py`, `activation.py`), which the GPU tests
compare against. flashinfer is imported inside each op, so importing this module is free on
CPU. Inputs are bf16/fp16 CUDA tensors; weights are in the input's dtype. Each kernel computes
in fp32 and rounds once, so it differs from a reference that rounds twice by bf16 rounding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

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


def cos_sin_cache(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`RotaryEmbedding`'s cos/sin buffers, each (P, D/2) -> one (P, D) fp32 cache, cos | sin
    per position (the layout of kvcache/store.py's fused RoPE kernel, and FlashInfer's)."""
    return torch.cat((cos, sin), dim=-1).float().contiguous()


def jit_specs() -> list[JitSpec]:
    """The FlashInfer JIT modules the ops above use (norm, silu_and_mul)."""
    from flashinfer.jit import gen_act_and_mul_module
    from flashinfer.jit.norm import gen_norm_module

    return [gen_norm_module(), gen_act_and_mul_module("silu")]


# ---- torch references (the math of the torch-native layers) ----


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (rmsnorm(x + residual), x + residual), out of place."""
    s = x + residual
    return rmsnorm_ref(s, weight, eps), s


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_ref(
    positions: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x (T, H, D) rotated out of place; cos/sin (P, D/2) as `RotaryEmbedding` holds them."""
    c = cos[positions].unsqueeze(1)  # (T, 1, D/2)
    s = sin[positions].unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
