"""Piecewise CUDA graphs for batches with prompt tokens (prefill and mixed batches) of up to
`max_tokens` tokens.

A decode graph (decode.py) holds its attention: a decode batch's attention plan has one
shape per batch size. A batch with prompt chunks has not (how its rows split into decodes
and chunks, each chunk's length), so its attention runs eagerly, between graphs. Each
token-count bucket's decoder stack is captured as num_layers + 1 pieces, cut at every
attention call: piece 0 runs the embedding and layer 0 up to its KV store, piece i the rest
of layer i-1 (o_proj, norms, MLP) and layer i up to its KV store, the last piece the rest
of the last layer and the final norm. A step replays piece 0, then per layer the attention
kernels (planned for the real batch) and the next piece; the LM head runs eagerly on the
sampling rows. So a layer costs the host one graph launch and the attention call instead of
~10 launches through Python (eager mixed steps spent ~0.5 ms of host a layer).

Every bucket's pieces read one set of static buffers: input ids, positions, KV slots, q
(the fused RoPE kernel writes the rotated q there: `rope_and_store(q_out=...)`) and the
attention output. What one piece hands the next (the residual stream) lives in the graphs'
memory pool. Blocks there are reused within a bucket safely because its pieces replay in
the order they were captured, and across buckets because a bucket's tensors are dead once
its last piece ran (each keeps only its final hidden states); so all buckets, captured
largest first, share one pool.

Buckets (engine/route.py's `piece_sizes`): every multiple of 16 tokens up to
`cuda_graph_max_tokens` (512 by default), and one at the scheduler's chunk size: a prefill step that fills the token budget has exactly that many
tokens, and eagerly a small model's such step is host-bound (Qwen3-0.6B's 8,192-token steps
took 22-25 ms with 17 ms of kernels; its host launched ~0.4-0.6 ms a layer).

Padding: a batch of T tokens replays the bucket P >= T its route names (P - T < 16); other
batches (between 512 and the chunk size) run eagerly. Rows T..P read token 0 at
position 0 and write their KV into the pool's dummy slot; attention is planned and run for
the T real rows only, so rows T..P of its output hold stale values. Nothing outside
attention mixes rows, and the LM head reads real rows only."""

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

class PiecewiseGraphs:
    def __init__(self, model: LlamaForCausalLM, backend: GraphAttnBackend, ctx: Context,
                 sizes: list[int], cap: Capture, dummy_slot: int, q_shape: tuple[int, int],
                 dtype: torch.dtype) -> None:
        """sizes: the token-count buckets, ascending; q_shape: (query heads, head dim)."""
        assert sizes and sizes == sorted(set(sizes)), sizes
        self.sizes = sizes
        n, device = sizes[-1], cap.device
        self.model, self.backend, self.ctx = model, backend, ctx
        self.inputs = StaticInputs(n, dummy_slot, device)
        self.q = torch.zeros((n, *q_shape), dtype=dtype, device=device)
        self.attn_out = torch.zeros_like(self.q)
        self.buckets: dict[int, tuple[list[torch.cuda.CUDAGraph], torch.Tensor]] = {}
        self._capturing: list[torch.cuda.CUDAGraph] | None = None
        self._pool = cap.pool
        self._capture(cap)

    # ---- the attention backend's side of a capture: a GraphBreak ----

    def q_out(self, tokens: int) -> torch.Tensor:
        return self.q[:tokens]

    def cut(self, layer_id: int, tokens: int) -> torch.Tensor:
        if self._capturing is not None:
            assert len(self._capturing) == layer_id + 1, (len(self._capturing), layer_id)
            self._capturing[-1].capture_end()
            self._capturing.append(torch.cuda.CUDAGraph())
            self._capturing[-1].capture_begin(pool=self._pool)
        return self.attn_out[:tokens]

    # ---- capture and replay ----

    def _capture(self, cap: Capture) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(cap.device)[0]
        try:
            for size in reversed(self.sizes):
                batch = self.inputs.batch(size, [size])
                route = Route(RouteKind.PIECEWISE, Attn.PREFILL, size)
                self.backend.prepare_for_capture(batch, route, graph_break=self)
                ids, pos = batch.input_ids, batch.positions
                with torch.inference_mode(), self.ctx.forward_batch(batch):
                    cap.warm_up(partial(self.model.model, ids, pos))  # attention skipped
                    with torch.cuda.stream(cap.stream):
                        self._capturing = [torch.cuda.CUDAGraph()]
                        self._capturing[0].capture_begin(pool=self._pool)
                        hidden = self.model.model(ids, pos)
                        self._capturing[-1].capture_end()
                    torch.cuda.current_stream(cap.device).wait_stream(cap.stream)
                self.buckets[size] = (self._capturing, hidden)
                self._capturing = None
        finally:
            self._capturing = None
        pieces = sum(len(g) for g, _ in self.buckets.values())
        logger.info("captured piecewise CUDA graphs for batches with prompt tokens: %d buckets "
                    "(%d..%d tokens), %d pieces in %.1f s, %.0f MiB", len(self.sizes),
                    self.sizes[0], self.sizes[-1], pieces, time.perf_counter() - t0,
                    cap.used_since(free0))

    def run(self, batch: Batch, route: Route) -> torch.Tensor:
        """Plan the batch's attention, replay its bucket's pieces with the attention between
        them -> the logits (B, V) of its sampling rows."""
        n = batch.num_tokens
        indices = to_device(batch.last_token_indices, batch.input_ids.device)
        self.inputs.load(batch, route.size)
        self.backend.prepare(batch, route)
        pieces, hidden = self.buckets[route.size]
        q, out = self.q[:n], self.attn_out[:n]
        for layer, piece in enumerate(pieces[:-1]):
            piece.replay()
            self.backend.attend(layer, q, out)
        pieces[-1].replay()
        return self.model.logits(hidden, indices)
