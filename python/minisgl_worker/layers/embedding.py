from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import get_tp_info


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous `vocab / tp` slice of rows (all rows at tp=1)."""

    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        tp = get_tp_info()
        self.vocab_size = vocab_size
        self.vocab_local = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.vocab_local
        self.weight = nn.Parameter(torch.empty(self.vocab_local, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert get_tp_info().size == 1, "tensor parallelism is not wired yet"
        return F.embedding(ids, self.weight)  # (T, H)

    def load(self, shard: str | None, name: str, tensor: torch.Tensor) -> None:
        assert shard is None and name == "weight"
        local = tensor[self.vocab_start : self.vocab_start + self.vocab_local]
        self.weight.data[: local.shape[0]].copy_(local)


class LMHead(VocabParallelEmbedding):
    """hidden -> logits. With tied embeddings the model points `weight` at the embedding's."""

    def forward(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """-> (B, V) logits, written into `out` when given (the CUDA graphs' shared buffer)."""
        assert get_tp_info().size == 1, "tensor parallelism is not wired yet"
        if out is None:
            return F.linear(hidden, self.weight)
        return torch.mm(hidden, self.weight.t(), out=out)
