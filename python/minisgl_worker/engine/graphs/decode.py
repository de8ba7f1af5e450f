"""Decode CUDA graphs, one per padded batch size (engine/route.py's `graph_batch_sizes`).

A decode step launches ~10 kernels per layer; at small models the launch gaps are most of
the step, so each size's whole forward (embedding to logits) is captured once at start and
replayed. All graphs read one set of static inputs, share one memory pool (captured largest
first, so the smaller ones fit in its blocks) and write their logits into one buffer. A
batch of B requests runs the graph of its route's size >= B; the padding rows read token 0
at position 0, write their KV into the pool's dummy page and attend over it only. Attention
is planned for the padded batch before every replay (the backend's `prepare`).

Sizes with the WHOLE_KV variant have a second graph whose attention does not split the KV
(attention/triton_decode.py: no merge kernel, longest requests first); the route table
picks it per step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import torch

from ...attention import GraphAttnBackend
from ...context import Context
from ...core import Attn, Batch, Route, RouteKind
from ...startup import progress
from .capture import Capture, StaticInputs

logger = logging.getLogger(__name__)

ModelFn = Callable[..., torch.Tensor]  # (input_ids, positions, logits_indices, logits_out)


class DecodeGraphs:
    def __init__(self, model: ModelFn, backend: GraphAttnBackend, ctx: Context,
                 sizes: list[int], whole_kv: list[int], dummy_slot: int,
                 device: torch.device) -> None:
        self.max_bs = sizes[-1]
        self.backend, self.ctx = backend, ctx
        self.inputs = StaticInputs(self.max_bs, dummy_slot, device)
        self.indices = torch.arange(self.max_bs, device=device)
        self.graphs: dict[tuple[int, Attn], torch.cuda.CUDAGraph] = {}
        self.logits = torch.empty(0)  # (max_bs, V), shaped by the first warm-up
        variants = [(bs, Attn.SPLIT_KV) for bs in sizes] + [(bs, Attn.WHOLE_KV) for bs in whole_kv]
        variants.sort(key=lambda v: (-v[0], v[1] is Attn.WHOLE_KV))  # largest first
        self._capture(model, Capture(device), variants)

    def _capture(self, model: ModelFn, cap: Capture, variants: list[tuple[int, Attn]]) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(cap.device)[0]
        bar = progress(variants, desc="capturing CUDA graphs", unit="graph")
        for bs, attn in bar:
            bar.set_postfix(bs=bs, split_kv=attn is Attn.SPLIT_KV)
            batch = self.inputs.batch(bs, [1] * bs)
            self.backend.prepare_for_capture(batch, Route(RouteKind.DECODE_GRAPH, attn, bs))
            args = (batch.input_ids, batch.positions, self.indices[:bs])
            with self.ctx.forward_batch(batch):
                out = cap.warm_up(partial(model, *args))
                if not self.logits.numel():
                    self.logits = out.new_empty(self.max_bs, out.shape[1])
                self.graphs[bs, attn], _ = cap.graph(partial(model, *args, self.logits[:bs]))
        used = cap.used_since(free0)
        logger.info("captured %d decode CUDA graphs (batch 1..%d, %d of them without split-KV) "
                    "in %.1f s, %.0f MiB", len(self.graphs), self.max_bs,
                    sum(a is Attn.WHOLE_KV for _, a in self.graphs), time.perf_counter() - t0,
                    used)

    def run(self, batch: Batch, route: Route) -> torch.Tensor:
        """Replay the graph of the route's padded size and attention -> logits (B, V)."""
        self.inputs.load(batch, route.size)
        self.backend.prepare(batch, route)
        self.graphs[route.size, route.attn].replay()
        return self.logits[: batch.size]
