"""Rotary position embedding (neox / "rotate_half" layout, as Llama in HF) with a cos/sin
cache over all positions. Scaling: none/default, linear, and llama3 (frequency-dependent
interpolation, the same formula as HF `_compute_llama3_parameters`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class RopeScaling:
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


def _inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    if scaling.rope_type != "llama3":
        assert scaling.rope_type == "default", f"unsupported rope_type {scaling.rope_type}"
        return inv
    old_ctx = scaling.original_max_position_embeddings
    low_wavelen = old_ctx / scaling.low_freq_factor
    high_wavelen = old_ctx / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    cos: torch.Tensor  # (max_positions, D/2) float32 buffers, never cast to the model dtype
    sin: torch.Tensor

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling
    ) -> None:
        super().__init__()
        inv = _inv_freq(head_dim, theta, scaling).float()
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv)  # (P, D/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,), q (T, Hq, D), k (T, Hkv, D) -> rotated q, k."""
        cos = self.cos[positions].unsqueeze(1)  # (T, 1, D/2)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
