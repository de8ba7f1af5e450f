"""The attention plug point. A backend is built once per engine; per batch, the engine calls
`prepare_metadata(batch)` before the forward, and every attention layer calls
`forward(q, k, v, layer_id)`, which writes k/v into the KV pool at `batch.out_loc` and
attends each request's queries over its cached tokens (prefix + this extend)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from ..core import Batch
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from ..kvcache.pool import MHAKVPool

QKNorm = tuple[RMSNorm, RMSNorm]  # per-head RMSNorm of q and of k (Qwen3)


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill `batch.attn_metadata` (it reads the page table rows of the batch's requests,
        so call it after their new tokens' slots are written)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rotary: RotaryEmbedding | None = None, qk_norm: QKNorm | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) of the batch's new tokens -> (T, Hq, D); with
        `qk_norm` and `rotary`, q and k are normalized per head and rotated by the batch's
        positions first."""


def rope_and_store(kv_pool: MHAKVPool, layer_id: int, batch: Batch, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, rotary: RotaryEmbedding | None,
                   qk_norm: QKNorm | None = None) -> torch.Tensor:
    """Normalize q and k per head (if `qk_norm`), rotate them by the batch's positions (if
    `rotary`) and write k and v into the pool at `batch.out_loc` -> the new q. With the
    fused cos/sin cache on CUDA that is one kernel (kvcache/store.py), q updated in place."""
    if rotary is not None and rotary.cos_sin is not None and k.is_cuda:
        norm = None
        if qk_norm is not None:
            q_norm, k_norm = qk_norm
            assert q_norm.eps == k_norm.eps, (q_norm.eps, k_norm.eps)
            norm = (q_norm.weight, k_norm.weight, q_norm.eps)
        kv_pool.rope_store(layer_id, batch.out_loc, batch.positions, rotary.cos_sin, q, k, v,
                           norm)
        return q
    if qk_norm is not None:
        q, k = qk_norm[0](q), qk_norm[1](k)
    if rotary is not None:
        q, k = rotary(batch.positions, q, k)
    kv_pool.store(layer_id, batch.out_loc, k, v)
    return q
