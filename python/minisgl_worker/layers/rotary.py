"""Rotary position embedding (neox / "rotate_half" layout, as Llama in HF) with a cos/sin
cache over all positions. Scaling: none/default, linear, llama3 (frequency-dependent
interpolation, HF `_compute_llama3_parameters`) and yarn (HF `_compute_yarn_parameters`: a
ramp between interpolated and extrapolated frequencies, cos/sin scaled by the attention
factor). One `RotaryEmbedding` is shared by every layer of a model (the Llama-3.1 cache over
131k positions is 64 MiB; per layer it would be 2 GiB)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class RopeScaling:
    rope_type: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_ctx = s.original_max_position_embeddings
    low_wavelen = old_ctx / s.low_freq_factor
    high_wavelen = old_ctx / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv: torch.Tensor, dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    def correction_dim(rotations: float) -> float:
        ctx = s.original_max_position_embeddings
        return dim * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency, 0: interpolate it
    freqs = inv / s.factor * (1 - extrapolate) + inv * extrapolate
    factor = s.attention_factor
    if factor is None:
        if s.mscale and s.mscale_all_dim:
            factor = _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
        else:
            factor = _yarn_mscale(s.factor)
    return freqs, factor


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """-> (inverse frequencies (D/2,) float32, factor applied to cos and sin)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = scaling.rope_type
    if kind == "linear":
        return inv / scaling.factor, 1.0
    if kind == "llama3":
        return _llama3(inv, scaling), 1.0
    if kind == "yarn":
        return _yarn(inv, head_dim, theta, scaling)
    assert kind == "default", f"unsupported rope_type {kind}"
    return inv, 1.0


class RotaryEmbedding(nn.Module):
    cos: torch.Tensor  # (max_positions, D/2) float32 buffers, never cast to the model dtype
    sin: torch.Tensor
    cos_sin: torch.Tensor | None  # (max_positions, D) float32, cos | sin: the fused kernel's

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling,
        fused: bool = False,
    ) -> None:
        """fused: the attention backend applies it in the fused qk-norm + RoPE + KV-store
        kernel (CUDA, attention/store.py), which reads `cos_sin`; else `forward` (torch)."""
        super().__init__()
        inv, factor = rope_frequencies(head_dim, theta, scaling)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv.to(t.device))  # (P, D/2)
        self.register_buffer("cos", freqs.cos() * factor, persistent=False)
        self.register_buffer("sin", freqs.sin() * factor, persistent=False)
        self.fused = fused
        # Not a buffer: nothing casts it (float32, as the kernel reads it).
        self.cos_sin = torch.cat((self.cos, self.sin), dim=-1).contiguous() if fused else None

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,), q (T, Hq, D), k (T, Hkv, D) -> rotated q, k (new tensors)."""
        cos = self.cos[positions].unsqueeze(1)  # (T, 1, D/2)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
