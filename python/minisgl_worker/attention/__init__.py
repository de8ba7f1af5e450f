"""Attention backends behind `BaseAttnBackend`; `create_attention_backend` picks one.
FlashInfer is CUDA-only and imported lazily, so nothing CUDA-only is imported on CPU."""

from __future__ import annotations

import importlib.util

import torch

from ..kvcache import MHAKVPool
from .base import BaseAttnBackend, GraphAttnBackend
from .torch_native import TorchNativeBackend

__all__ = ["BaseAttnBackend", "GraphAttnBackend", "TorchNativeBackend",
           "create_attention_backend"]

BACKENDS = ("auto", "torch", "flashinfer")


def resolve_backend_name(name: str, device: torch.device) -> str:
    """"auto": FlashInfer on CUDA when it is installed, else torch-native."""
    assert name in BACKENDS, f"unknown attention backend {name!r} (one of {BACKENDS})"
    if name != "auto":
        return name
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    return "flashinfer" if device.type == "cuda" and has_flashinfer else "torch"


def create_attention_backend(
    name: str, kv_pool: MHAKVPool, page_table: torch.Tensor, scale: float, num_qo_heads: int,
    dtype: torch.dtype,
) -> BaseAttnBackend:
    """dtype: the model's (the queries'); the pool may hold FP8 instead. The torch-native
    backend takes it from each batch's q."""
    name = resolve_backend_name(name, kv_pool.k.device)
    if name == "flashinfer":
        from .flashinfer_backend import FlashInferBackend

        return FlashInferBackend(kv_pool, page_table, scale, num_qo_heads, dtype=dtype)
    return TorchNativeBackend(kv_pool, page_table, scale)
