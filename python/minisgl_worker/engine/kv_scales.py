"""The scales of an FP8 KV cache, calibrated once at start.

e4m3 keeps 3 mantissa bits over magnitudes 2^-6..448, and a small model's values sit far
below that range (the default model's V: medians 0.02-0.1), where a scale of 1 leaves them
subnormal. So each layer's K and V get their own scale, amax / 448 x HEADROOM, measured on
one scratch prefill (seeded token ids, the model's dtype KV) before the pool exists; larger
values later saturate at the range's edge instead of turning NaN (kvcache/quant.py)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..kvcache.quant import FP8_MAX
from ..models import ModelConfig
from .memory import scratch_forward
from .route import RouteTable

logger = logging.getLogger(__name__)

CALIBRATION_TOKENS = 512
HEADROOM = 2.0  # room above the calibration's amax before values saturate


def calibrate(model: nn.Module, cfg: ModelConfig, backend_name: str, routes: RouteTable,
              dtype: torch.dtype, device: torch.device, page_size: int,
              ) -> tuple[list[float], list[float]]:
    """-> per layer, the K scales and the V scales."""
    gen = torch.Generator().manual_seed(0)
    n = min(CALIBRATION_TOKENS, cfg.max_context)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
    with scratch_forward(model, cfg, backend_name, routes, dtype, device, page_size, [n],
                         ids) as (pool, forward):
        forward()
        k_amax = pool.k.flatten(1).abs().amax(dim=1).float().tolist()
        v_amax = pool.v.flatten(1).abs().amax(dim=1).float().tolist()

    def scale(amax: float) -> float:
        return max(amax, 1e-6) * HEADROOM / FP8_MAX

    k_scales, v_scales = [scale(a) for a in k_amax], [scale(a) for a in v_amax]
    logger.info("FP8 KV scales from a %d-token calibration: K %.2e..%.2e, V %.2e..%.2e", n,
                min(k_scales), max(k_scales), min(v_scales), max(v_scales))
    return k_scales, v_scales
