"""Whole CUDA graphs for small mixed steps: decodes beside prompt chunks, at most
`sizes[-1]` tokens (a step under `--mixed-step-tokens`, or a request arriving while others
decode), up to EngineConfig.cuda_graph_mixed_tokens (256 by default).

The piecewise graphs (piecewise.py) run such a step's attention eagerly between the pieces
of every layer: on the H200 that cost ~0.1-0.45 ms a step of GPU gaps over a decode graph,
and Qwen3-0.6B's mixed steps were host-bound. Here the attention is captured too
(attention/mixed_graph.py: the same FA2 kernel that the piecewise graphs' plan runs, with a
plan a graph can replay), so such a step costs the host what a decode step does: one plan,
one replay. Because that plan is fixed at capture, the route table sends here only the
steps whose eager plan it matches (engine/route.py).

One graph per multiple of 16 rows; a step of T tokens replays the size its route names
(at most 15 padding rows, which read token 0 at position 0 and write their KV into the
pool's dummy slot). All sizes read one set of static inputs, and their memory pool is the
piecewise graphs': a replay's tensors are dead once its hidden states are read, which the
LM head does next, before any other graph replays."""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from ...attention import GraphAttnBackend
from ...context import Context
from ...core import Attn, Batch, Route, RouteKind
from ...models import LlamaForCausalLM
from ...transfer import to_device
from .capture import Capture, StaticInputs

logger = logging.getLogger(__name__)


class MixedGraphs:
    def __init__(self, model: LlamaForCausalLM, backend: GraphAttnBackend, ctx: Context,
                 sizes: list[int], cap: Capture, dummy_slot: int) -> None:
        """sizes: ascending multiples of 16 (`piece_sizes`); cap: the piecewise graphs'."""
        assert sizes and sizes == sorted(set(sizes)), sizes
        self.sizes, self.model, self.backend, self.ctx = sizes, model, backend, ctx
        self.inputs = StaticInputs(sizes[-1], dummy_slot, cap.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture(cap)

    def _capture(self, cap: Capture) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(cap.device)[0]
        for size in reversed(self.sizes):
            batch = self.inputs.batch(size, [1] * size)
            self.backend.prepare_for_capture(batch, Route(RouteKind.MIXED_GRAPH, Attn.MIXED_FA2,
                                                          size))
            ids, pos = batch.input_ids, batch.positions
            with torch.inference_mode(), self.ctx.forward_batch(batch):
                cap.warm_up(partial(self.model.model, ids, pos))
                self.graphs[size] = cap.graph(partial(self.model.model, ids, pos))
        logger.info("captured %d mixed-step CUDA graphs (%d..%d tokens) in %.1f s, %.0f MiB",
                    len(self.graphs), self.sizes[0], self.sizes[-1], time.perf_counter() - t0,
                    cap.used_since(free0))

    def run(self, batch: Batch, route: Route) -> torch.Tensor:
        """Plan the batch's attention, replay its size's graph -> the logits (B, V) of its
        sampling rows."""
        indices = to_device(batch.last_token_indices, batch.input_ids.device)
        self.inputs.load(batch, route.size)
        self.backend.prepare(batch, route)
        graph, hidden = self.graphs[route.size]
        graph.replay()
        return self.model.logits(hidden, indices)
