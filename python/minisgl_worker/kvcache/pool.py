"""Paged MHA KV pool: per layer, k and v buffers shaped (pages, page_size, kv_heads, D).
One extra page past `num_pages`, `dummy_page`, is never handed out: padded rows of a
CUDA-graph decode batch write their KV there and attend over it.

Attention addresses the pool by *slot* (`page * page_size + offset`), a flat index into the
(pages * page_size, kv_heads, D) view; the page table holds one slot per token position.
The pool's dtype is the model's, or FP8 (e4m3) with a scale per layer for K and for V
(quant.py, engine/kv_scales.py), which halves the bytes a token takes in bf16."""

from __future__ import annotations

import torch

from .quant import FP8


class MHAKVPool:
    def __init__(
        self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
        head_dim: int, dtype: torch.dtype, device: torch.device,
        scales: tuple[list[float], list[float]] | None = None,
    ) -> None:
        """scales: per layer, K's and V's (stored = value / scale; FP8 only)."""
        shape = (num_layers, num_pages + 1, page_size, num_kv_heads, head_dim)
        self.dtype = dtype
        self.k_scale, self.v_scale = scales or ([1.0] * num_layers, [1.0] * num_layers)
        assert len(self.k_scale) == len(self.v_scale) == num_layers
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_pages = num_pages  # usable pages; the allocator's
        self.page_size = page_size
        self.dummy_page = num_pages

    @property
    def quantized(self) -> bool:
        """Whether the pool stores FP8, scaled (else the model's dtype, as is)."""
        return self.dtype == FP8

    def scales(self, layer: int) -> tuple[float, float] | None:
        """Layer `layer`'s (K scale, V scale) when the pool is FP8, else None: what the
        store kernels and the attention kernels take."""
        return (self.k_scale[layer], self.v_scale[layer]) if self.quantized else None

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def k_slots(self, layer: int) -> torch.Tensor:
        return self.k[layer].view(-1, *self.k.shape[3:])  # (S + page_size, Hkv, D)

    def v_slots(self, layer: int) -> torch.Tensor:
        return self.v[layer].view(-1, *self.v.shape[3:])

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize
