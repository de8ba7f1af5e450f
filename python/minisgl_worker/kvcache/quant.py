"""How KV is stored when the pool's dtype is not the model's: FP8 (e4m3) with a per-tensor
scale. Values are divided by the scale and saturated to e4m3's range on the way in (a cast
alone turns out-of-range values into NaN), multiplied back on the way out."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
KV_DTYPES = ("auto", "fp8_e4m3")


def to_cache(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x in the model's dtype -> the pool's `dtype`."""
    if dtype != FP8:
        return x.to(dtype)
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Values read from the pool -> the model's `dtype`."""
    if x.dtype != FP8:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)
