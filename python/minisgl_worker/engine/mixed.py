"""Whole CUDA graphs for small mixed steps: decodes beside prompt chunks, at most
`sizes[-1]` tokens (a step under `--mixed-step-tokens`, or a request arriving while others
decode), up to EngineConfig.cuda_graph_mixed_tokens (256 by default).

The piecewise graphs (piecewise.py) run such a step's attention eagerly between the pieces
of every layer: on the H200 that cost ~0.1-0.45 ms a step of GPU gaps over a decode graph,
and Qwen3-0.6B's mixed steps were host-bound (benches/RESULTS.md). Here the attention is
captured too (attention/mixed_graph.py: the same FA2 kernel that the piecewise graphs' plan
runs, with a plan a graph can replay), so such a step costs the host what a decode step
does: one plan, one replay.

The first version (5303cbe) ran the decode rows on the whole-KV Triton kernel and the
chunks on FA2 in graph mode, which split and merged: Llama-3.1-8B's capped steps took 12.9
ms on the GPU against the piecewise graphs' 12.3 (kernel traces, RESULTS.md, "Tenth
session"). This one runs what the piecewise graphs run, so it takes only the batches whose
eager plan it matches (`can_run`).

One graph per multiple of 16 rows (piecewise.py's buckets); a step of T tokens replays the
smallest size >= T (at most 15 padding rows, which read token 0 at position 0 and write
their KV into the pool's dummy slot). All sizes read one set of static inputs, and their memory pool is
the piecewise graphs': a replay's tensors are dead once its hidden states are read, which
the LM head does next, before any other graph replays."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from ..attention.flashinfer_backend import FlashInferBackend
from ..attention.mixed_graph import QUERY_TILE, MixedGraphAttention
from ..core import Batch, Context
from ..models import LlamaForCausalLM
from .piecewise import bucket_for
from .static_inputs import StaticInputs

if TYPE_CHECKING:  # what torch.cuda.graph_pool_handle() returns (torch names it privately)
    from torch.cuda import _POOL_HANDLE

logger = logging.getLogger(__name__)


def min_requests(num_sms: int, num_kv_heads: int) -> int:
    """The fewest requests for which FA2's eager plan leaves long KV unsplit, as the graphs
    do: it splits while its tiles (at least one a request) fit in 2 CTAs a SM per KV head
    (scheduler.cuh, `max_batch_size_if_split`)."""
    return 2 * num_sms // num_kv_heads + 1


class MixedGraphs:
    def __init__(self, model: LlamaForCausalLM, backend: FlashInferBackend, ctx: Context,
                 sizes: list[int], max_pages_per_req: int, pool: _POOL_HANDLE,
                 device: torch.device) -> None:
        """sizes: ascending multiples of 16 (`piece_sizes`); pool: the CUDA-graph memory pool
        to share."""
        assert sizes and sizes == sorted(set(sizes)), sizes
        self.sizes, self.model, self.backend, self.ctx = sizes, model, backend, ctx
        kv, attn = backend.kv_pool, backend.attn
        assert attn.use_tensor_cores, "a mixed step runs whole on FA2 with tensor-core decode"
        self.group = attn.num_qo_heads // attn.num_kv_heads
        self.min_requests = min_requests(
            torch.cuda.get_device_properties(device).multi_processor_count, attn.num_kv_heads)
        self.attn = MixedGraphAttention(attn, backend.page_table, sizes, kv.dummy_page,
                                        max_pages_per_req)
        self.inputs = StaticInputs(sizes[-1], kv.dummy_page * kv.page_size, device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture(pool, device)

    def _capture(self, pool: _POOL_HANDLE, device: torch.device) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(device)[0]
        stream = torch.cuda.Stream(device)
        for size in reversed(self.sizes):
            # One row a request, every request on the dummy page: FA2's tile is fixed here.
            batch = self.inputs.batch(size, [1] * size)
            self.attn.plan(size, [-1] * size, [1] * size, [1] * size)
            ids, pos = batch.input_ids, batch.positions
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), self.ctx.forward_batch(batch):
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    self.model.model(ids, pos)  # warm-up outside capture (Triton, cuBLAS)
                torch.cuda.current_stream(device).wait_stream(stream)
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    hidden = self.model.model(ids, pos)
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize(device)
        logger.info("captured %d mixed-step CUDA graphs (%d..%d tokens, from %d requests) "
                    "in %.1f s, %.0f MiB", len(self.graphs), self.sizes[0], self.sizes[-1],
                    self.min_requests, time.perf_counter() - t0,
                    (free0 - torch.cuda.mem_get_info(device)[0]) / 2**20)

    def can_run(self, batch: Batch) -> bool:
        """Whether a size holds the batch's tokens and the graphs' FA2 plan is the one the
        piecewise graphs' eager plan would make: the 16-row query tile (which that plan
        picks when the mean request's packed query, tokens x GQA group, is at most 16) and
        no split of long KV (enough requests; `min_requests`). Other batches, such as a few
        long prompt chunks alone, take the piecewise graphs, whose plan tiles them larger."""
        n, reqs = batch.num_tokens, batch.size
        return (bucket_for(self.sizes, n) is not None and reqs >= self.min_requests
                and n * self.group <= QUERY_TILE * reqs)

    def run(self, batch: Batch, logits_indices: torch.Tensor) -> torch.Tensor:
        """Plan the batch's attention, replay its size's graph -> the logits (B, V) of the
        rows `logits_indices`."""
        size = bucket_for(self.sizes, batch.num_tokens)
        assert size is not None, f"no mixed graph for {batch.num_tokens} tokens"
        self.inputs.load(batch, size)
        self.attn.plan(size, [r.table_idx for r in batch.reqs],
                       [r.device_len for r in batch.reqs], batch.extend_lens)
        graph, hidden = self.graphs[size]
        graph.replay()
        return self.model.logits(hidden, logits_indices)
