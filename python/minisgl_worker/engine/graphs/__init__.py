"""The engine's runners, one per route kind: eager, and the three families of CUDA graphs
(decode.py, piecewise.py, mixed.py), captured at start for the sizes the route table holds."""

from __future__ import annotations

import torch

from ...attention import BaseAttnBackend, GraphAttnBackend
from ...context import Context
from ...core import Batch, Route, RouteKind
from ...distributed import get_tp_info
from ...models import LlamaForCausalLM
from ...transfer import to_device
from ..route import GraphSizes
from .capture import Capture, Runner, StaticInputs
from .decode import DecodeGraphs
from .mixed import MixedGraphs
from .piecewise import PiecewiseGraphs

__all__ = ["Capture", "DecodeGraphs", "Eager", "MixedGraphs", "PiecewiseGraphs", "Runner",
           "StaticInputs", "capture_graphs"]


class Eager:
    """No graph: plan, then run the model's forward."""

    def __init__(self, model: LlamaForCausalLM, backend: BaseAttnBackend, ctx: Context) -> None:
        self.model, self.backend, self.ctx = model, backend, ctx

    def run(self, batch: Batch, route: Route) -> torch.Tensor:
        indices = to_device(batch.last_token_indices, batch.input_ids.device)
        self.backend.prepare(batch, route)
        with self.ctx.forward_batch(batch):
            return self.model(batch.input_ids, batch.positions, indices)  # (B, V)


def capture_graphs(model: LlamaForCausalLM, backend: GraphAttnBackend, ctx: Context,
                   sizes: GraphSizes, dummy_slot: int, max_pages_per_req: int,
                   device: torch.device) -> dict[RouteKind, Runner]:
    """Capture every graph of `sizes` -> the runner of each graph route kind captured."""
    cfg = model.config
    backend.init_capture_graph(sizes.decode, sizes.whole_kv, sizes.mixed, max_pages_per_req)
    runners: dict[RouteKind, Runner] = {}
    if sizes.decode:
        with torch.inference_mode():
            runners[RouteKind.DECODE_GRAPH] = DecodeGraphs(
                model, backend, ctx, sizes.decode, sizes.whole_kv, dummy_slot, device)
    if sizes.pieces:
        cap = Capture(device)
        dtype = next(model.parameters()).dtype
        runners[RouteKind.PIECEWISE] = PiecewiseGraphs(
            model, backend, ctx, sizes.pieces, cap, dummy_slot, (cfg.num_heads // get_tp_info().size, cfg.head_dim),
            dtype)
        if sizes.mixed:
            runners[RouteKind.MIXED_GRAPH] = MixedGraphs(model, backend, ctx, sizes.mixed, cap,
                                                         dummy_slot)
    return runners
