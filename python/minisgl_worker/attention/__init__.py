"""Attention backends behind `BaseAttnBackend`; `create_attention_backend` picks one.
FlashInfer (CUDA only) and a prefill/decode hybrid come later: import them lazily here so
nothing CUDA-only is imported on CPU."""

from __future__ import annotations

import torch

from ..kvcache import MHAKVPool
from .base import BaseAttnBackend
from .torch_native import TorchNativeBackend

__all__ = ["BaseAttnBackend", "TorchNativeBackend", "create_attention_backend"]


def create_attention_backend(
    name: str, kv_pool: MHAKVPool, page_table: torch.Tensor, scale: float
) -> BaseAttnBackend:
    if name == "torch":
        return TorchNativeBackend(kv_pool, page_table, scale)
    raise ValueError(f"unknown attention backend {name!r} (available: torch)")
