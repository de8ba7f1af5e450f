"""What every family of CUDA graphs shares: the static input rows they read, and the
capture (a memory pool, a side stream, a warm-up outside the capture)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from ...core import Batch, Route

if TYPE_CHECKING:  # what torch.cuda.graph_pool_handle() returns (torch names it privately)
    from torch.cuda import _POOL_HANDLE


class Runner(Protocol):
    """One way to run a batch's forward (a route's kind): -> the logits (B, V) of its
    sampling rows."""

    def run(self, batch: Batch, route: Route) -> torch.Tensor: ...


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


class Capture:
    """Captures on a side stream into one memory pool. Graphs that share a pool must replay
    one at a time, each one's outputs read before the next replays (true of the engine's:
    one batch at a time, its logits taken before the next batch)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool: _POOL_HANDLE = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def warm_up(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """fn() once outside any capture (lazy inits: cuBLAS workspaces, Triton's JIT)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return out

    def graph(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """fn() captured whole -> (the graph, its output: valid after each replay)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        return graph, out

    def used_since(self, free_before: int) -> float:
        """MiB of GPU memory taken since `free_before` (torch.cuda.mem_get_info's free)."""
        torch.cuda.synchronize(self.device)
        return (free_before - torch.cuda.mem_get_info(self.device)[0]) / 2**20
