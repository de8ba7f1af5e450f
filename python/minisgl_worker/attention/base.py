"""The attention plug point. A backend is built once per engine; per batch, the engine calls
`prepare_metadata(batch)` before the forward, and every attention layer calls
`forward(q, k, v, layer_id)`, which writes k/v into the KV pool at `batch.out_loc` and
attends each request's queries over its cached tokens (prefix + this extend)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..core import Batch


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill `batch.attn_metadata` (it reads the page table rows of the batch's requests,
        so call it after their new tokens' slots are written)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) of the batch's new tokens -> (T, Hq, D)."""
