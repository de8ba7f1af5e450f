"""Whole CUDA graphs for small mixed steps: decodes with up to MAX_CHUNKS prompt chunks, at
most `sizes[-1]` tokens (a step under `--mixed-step-tokens`, or a request arriving while
others decode). Opt-in (EngineConfig.cuda_graph_mixed_tokens).

The piecewise graphs (piecewise.py) run such a step's attention eagerly between the pieces
of every layer: on the H200 that cost ~0.2-0.45 ms a step of GPU gaps over a decode graph,
and Qwen3-0.6B's mixed steps were host-bound (benches/RESULTS.md). Here the attention is
captured too (attention/mixed_graph.py: a prefill kernel for the chunks, the decode kernel
for the decodes, each with a plan a graph can replay), so such a step costs the host what a
decode step does: one plan, one replay.

Measured on the H200 offline workload with `lof --mixed-step-tokens 256` (RESULTS.md,
"Latest: ninth session"): Qwen3-0.6B 2% faster than through the piecewise graphs, but
Llama-3.1-8B 4.5% slower, for a reason not yet traced; so they are not the default.

One graph per multiple of 16 rows (piecewise.py's buckets); a step of T tokens replays the smallest size >= T
(at most 15 padding rows, which read token 0 at position 0 and write their KV into
the pool's dummy slot). All sizes read one set of static inputs, and their memory pool is
the piecewise graphs': a replay's tensors are dead once its hidden states are read, which
the LM head does next, before any other graph replays."""

from __future__ import annotations

import logging
import time

import torch

from ..attention.flashinfer_backend import FlashInferBackend, even_lengths
from ..attention.mixed_graph import MAX_CHUNKS, MixedGraphAttention
from ..core import Batch, Context
from ..models import LlamaForCausalLM
from .graph import WHOLE_KV_MIN_BS
from .piecewise import bucket_for
from .static_inputs import StaticInputs

logger = logging.getLogger(__name__)
# Fewer decodes than this attend faster split (as in the decode graphs), so their mixed
# steps take the piecewise graphs, whose plan splits long requests.
MIN_DECODES = WHOLE_KV_MIN_BS


class MixedGraphs:
    def __init__(self, model: LlamaForCausalLM, backend: FlashInferBackend, ctx: Context,
                 sizes: list[int], max_pages_per_req: int, pool: object,
                 device: torch.device) -> None:
        """sizes: ascending multiples of 16 (`piece_sizes`); pool: the CUDA-graph memory pool
        to share."""
        assert sizes and sizes == sorted(set(sizes)) and sizes[0] > MAX_CHUNKS, sizes
        self.sizes, self.model, self.backend, self.ctx = sizes, model, backend, ctx
        kv = backend.kv_pool
        self.attn = MixedGraphAttention(backend.attn, backend.page_table, sizes, kv.dummy_page,
                                        max_pages_per_req)
        self.inputs = StaticInputs(sizes[-1], kv.dummy_page * kv.page_size, device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture(pool, device)

    def _capture(self, pool: object, device: torch.device) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(device)[0]
        stream = torch.cuda.Stream(device)
        for size in reversed(self.sizes):
            decodes = size - MAX_CHUNKS  # every request on the dummy page, one row a chunk
            batch = self.inputs.batch(size, [1] * size)
            self.attn.plan(size, ([-1] * decodes, [1] * decodes),
                           ([-1] * MAX_CHUNKS, [1] * MAX_CHUNKS, [1] * MAX_CHUNKS))
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
        logger.info("captured %d mixed-step CUDA graphs (%d..%d tokens, up to %d prompt "
                    "chunks) in %.1f s, %.0f MiB", len(self.graphs), self.sizes[0],
                    self.sizes[-1], MAX_CHUNKS, time.perf_counter() - t0,
                    (free0 - torch.cuda.mem_get_info(device)[0]) / 2**20)

    def can_run(self, batch: Batch) -> bool:
        """Whether the batch (not all decodes) is decodes first, then at most MAX_CHUNKS
        requests, in tokens that a size holds, with decodes the whole-KV kernel suits: none,
        or at least MIN_DECODES of even lengths (no longer than twice their mean; without
        a split the longest request sets the kernel's time)."""
        d = _leading_decodes(batch)
        if bucket_for(self.sizes, batch.num_tokens) is None or not (
                d < batch.size <= d + MAX_CHUNKS):
            return False
        return not d or (d >= MIN_DECODES and even_lengths([r.device_len for r in batch.reqs[:d]]))

    def run(self, batch: Batch, logits_indices: torch.Tensor) -> torch.Tensor:
        """Plan the batch's attention, replay its size's graph -> the logits (B, V) of the
        rows `logits_indices`."""
        size = bucket_for(self.sizes, batch.num_tokens)
        assert size is not None, f"no mixed graph for {batch.num_tokens} tokens"
        d, reqs = _leading_decodes(batch), batch.reqs
        self.inputs.load(batch, size)
        self.attn.plan(size, ([r.table_idx for r in reqs[:d]], [r.device_len for r in reqs[:d]]),
                       ([r.table_idx for r in reqs[d:]], [r.device_len for r in reqs[d:]],
                        batch.extend_lens[d:]))
        graph, hidden = self.graphs[size]
        graph.replay()
        return self.model.logits(hidden, logits_indices)


def _leading_decodes(batch: Batch) -> int:
    """How many requests at the front of the batch decode (one token each)."""
    for i, (req, n) in enumerate(zip(batch.reqs, batch.extend_lens)):
        if not (req.is_decoding and n == 1):
            return i
    return batch.size
