"""The input buffers a set of CUDA graphs reads (graph.py's decode graphs, piecewise.py's
buckets): token ids, positions and KV slots, one row per token, filled before each replay."""

from __future__ import annotations

import torch

from ..core import Batch


class StaticInputs:
    """Rows for up to `rows` tokens. A batch of T tokens replayed in a graph of P >= T rows
    fills rows 0..T; rows T..P (what a larger batch left there) read token 0 at position 0
    and write their KV into `dummy_slot`, the pool's dummy page, so they touch nothing real."""

    def __init__(self, rows: int, dummy_slot: int, device: torch.device) -> None:
        self.dummy_slot = dummy_slot
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.out_loc = torch.full((rows,), dummy_slot, dtype=torch.long, device=device)

    def batch(self, rows: int, extend_lens: list[int]) -> Batch:
        """A request-less batch over the first `rows` rows, to capture a graph with."""
        return Batch(reqs=[], input_ids=self.input_ids[:rows], positions=self.positions[:rows],
                     out_loc=self.out_loc[:rows], extend_lens=extend_lens)

    def load(self, batch: Batch, padded: int) -> None:
        """Copy the batch's rows in and send rows T..`padded` to the dummy slot."""
        n = batch.input_ids.numel()
        assert n <= padded <= self.input_ids.numel(), (n, padded)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_loc[:n].copy_(batch.out_loc)
        if padded > n:
            self.out_loc[n:padded].fill_(self.dummy_slot)
            self.positions[n:padded].zero_()
