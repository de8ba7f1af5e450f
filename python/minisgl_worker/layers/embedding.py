"""Vocab-parallel embedding and LM head. Each rank holds a contiguous slice of
ceil(vocab / tp) rows (the last rank's tail zero-padded when tp does not divide the
vocabulary). The embedding looks up the ids in its slice, zeros the others and
all-reduces; the LM head computes its slice's logits and all-gathers them. At tp == 1 both
are plain ops."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import get_comm, get_tp_info


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        tp = get_tp_info()
        self.vocab_size = vocab_size
        self.vocab_local = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.vocab_local
        self.weight = nn.Parameter(torch.empty(self.vocab_local, hidden))
        self.comm = get_comm() if tp.size > 1 else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return F.embedding(ids, self.weight)  # (T, H)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)  # (T,)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.comm.all_reduce(out)  # (T, H): each id's row from the rank holding it

    def load(self, shard: str | None, name: str, full: Any) -> None:
        assert shard is None and name == "weight"
        rows = max(0, min(self.vocab_local, self.vocab_size - self.vocab_start))
        local = full[self.vocab_start : self.vocab_start + rows]
        assert local.shape == self.weight[:rows].shape, (
            f"embedding rows: the checkpoint's slice is {tuple(local.shape)}, the "
            f"parameter's {tuple(self.weight[:rows].shape)}")
        self.weight.data[:rows].copy_(local)
        self.weight.data[rows:].zero_()  # padding past the vocabulary


class LMHead(VocabParallelEmbedding):
    """hidden -> logits. With tied embeddings the model points `weight` at the embedding's."""

    def forward(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """-> (B, V) logits, written into `out` when given (the CUDA graphs' shared buffer)."""
        if self.comm is None:
            if out is None:
                return F.linear(hidden, self.weight)
            return torch.mm(hidden, self.weight.t(), out=out)
        local = F.linear(hidden, self.weight)  # (B, V / tp)
        gathered = self.comm.all_gather(local)  # (tp * B, V / tp), rank-major
        tp, b = self.comm.info.size, hidden.shape[0]
        logits = gathered.view(tp, b, self.vocab_local).transpose(0, 1).reshape(b, -1)
        logits = logits[:, : self.vocab_size]  # (B, V): the padding's columns dropped
        if out is None:
            return logits.contiguous()
        return out.copy_(logits)
