"""The attention plug point. A backend is built once per engine; per batch, the engine calls
`prepare_metadata(batch)` before the forward, and every attention layer calls
`forward(q, k, v, layer_id)`, which writes k/v into the KV pool at `batch.out_loc` and
attends each request's queries over its cached tokens (prefix + this extend)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..core import Batch
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from ..kvcache.pool import MHAKVPool



class Rope(NamedTuple):
    """What a backend does to q and k before it stores k: each head RMS-normalized first
    when `qk_norm` is given (Qwen3's q_norm and k_norm), then rotated by `positions`."""

    rotary: RotaryEmbedding
    positions: torch.Tensor  # (T,)
    qk_norm: tuple[RMSNorm, RMSNorm] | None = None


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill `batch.attn_metadata` (it reads the page table rows of the batch's requests,
        so call it after their new tokens' slots are written)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) of the batch's new tokens -> (T, Hq, D); with
        `rope`, q and k are (normalized and) rotated first."""


def rope_and_store(kv_pool: MHAKVPool, layer_id: int, out_loc: torch.Tensor, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, rope: Rope | None,
                   q_out: torch.Tensor | None = None) -> torch.Tensor:
    """Apply `rope` to q and k and write k and v into the pool at `out_loc` -> the new q,
    written into `q_out` when given (the fused kernel only). With the rotary's fused cos/sin
    cache (CUDA) that is one kernel (kvcache/store.py), q updated in place."""
    cos_sin = rope.rotary.cos_sin if rope is not None else None
    if rope is None or cos_sin is None:
        assert q_out is None, "q_out needs the fused RoPE kernel (CUDA, bf16/fp16)"
        return _rope_and_store_torch(kv_pool, layer_id, out_loc, q, k, v, rope)
    _, positions, qk_norm = rope
    norm = None
    if qk_norm is not None:
        q_norm, k_norm = qk_norm
        assert q_norm.eps == k_norm.eps, (q_norm.eps, k_norm.eps)
        norm = (q_norm.weight, k_norm.weight, q_norm.eps)
    kv_pool.rope_store(layer_id, out_loc, positions, cos_sin, q, k, v, norm, q_out)
    return q if q_out is None else q_out


def _rope_and_store_torch(kv_pool: MHAKVPool, layer_id: int, out_loc: torch.Tensor,
                          q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          rope: Rope | None) -> torch.Tensor:
    if rope is not None:
        if rope.qk_norm is not None:
            q, k = rope.qk_norm[0](q), rope.qk_norm[1](k)
        q, k = rope.rotary(rope.positions, q, k)
    kv_pool.store(layer_id, out_loc, k, v)
    return q
