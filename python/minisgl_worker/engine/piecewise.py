"""Piecewise CUDA graphs for batches with prompt tokens (prefill and mixed batches) of up to
`max_tokens` tokens.

A decode graph (graph.py) holds its attention: a decode batch's attention plan has one
shape per batch size. A batch with prompt chunks has not (how its rows split into decodes
and chunks, each chunk's length), so its attention runs eagerly, between graphs. Each
token-count bucket's decoder stack is captured as num_layers + 1 pieces, cut at every
attention call: piece 0 runs the embedding and layer 0 up to its KV store, piece i the rest
of layer i-1 (o_proj, norms, MLP) and layer i up to its KV store, the last piece the rest
of the last layer and the final norm. A step replays piece 0, then per layer the attention
kernels (planned for the real batch) and the next piece; the LM head runs eagerly on the
sampling rows. So a layer costs the host one graph launch and the attention call instead of
~10 launches through Python (the eager mixed steps in benches/RESULTS.md spent ~0.5 ms of
host a layer).

Every bucket's pieces read one set of static buffers: input ids, positions, KV slots, q
(the fused RoPE kernel writes the rotated q there: `rope_and_store(q_out=...)`) and the
attention output. What one piece hands the next (the residual stream) lives in the graphs'
memory pool. Blocks there are reused within a bucket safely because its pieces replay in
the order they were captured, and across buckets because a bucket's tensors are dead once
its last piece ran (each keeps only its final hidden states); so all buckets, captured
largest first, share one pool.

Buckets: every multiple of 16 tokens up to `max_tokens` (512 by default), and one at the
scheduler's chunk size: a prefill step that fills the token budget has exactly that many
tokens, and eagerly a small model's such step is host-bound (Qwen3-0.6B's 8,192-token steps
took 22-25 ms with 17 ms of kernels; its host launched ~0.4-0.6 ms a layer).

Padding: a batch of T tokens replays the smallest bucket P >= T when P - T < 16; other
batches (between 512 and the chunk size) run eagerly. Rows T..P read token 0 at
position 0 and write their KV into the pool's dummy slot; attention is planned and run for
the T real rows only, so rows T..P of its output hold stale values. Nothing outside
attention mixes rows, and the LM head reads real rows only."""

from __future__ import annotations

import logging
import time

import torch

from ..attention.flashinfer_backend import FlashInferBackend
from ..core import Batch, Context
from ..models import LlamaForCausalLM
from .static_inputs import StaticInputs

logger = logging.getLogger(__name__)

BUCKET = 16  # token-count granularity of the buckets (at most 15 padding rows a step)


def piece_sizes(max_tokens: int, chunk_tokens: int = 0) -> list[int]:
    """Every multiple of BUCKET up to `max_tokens`, and `chunk_tokens` (the scheduler's
    prefill budget: a step that fills it has exactly that many tokens) when it is larger."""
    sizes = list(range(BUCKET, max_tokens + 1, BUCKET))
    return sizes + [chunk_tokens] if sizes and chunk_tokens > sizes[-1] else sizes


def bucket_for(sizes: list[int], tokens: int) -> int | None:
    """The bucket a batch of `tokens` replays: the smallest size >= tokens, if that pads
    fewer than BUCKET rows (so a 600-token batch never pays for an 8192-token bucket)."""
    size = next((s for s in sizes if s >= tokens), None)
    return size if size is not None and size - tokens < BUCKET else None


class PiecewiseGraphs:
    def __init__(self, model: LlamaForCausalLM, backend: FlashInferBackend, ctx: Context,
                 sizes: list[int], device: torch.device) -> None:
        """sizes: the token-count buckets, ascending (`piece_sizes`)."""
        assert sizes and sizes == sorted(set(sizes)), sizes
        self.sizes = sizes
        n = sizes[-1]
        self.model, self.backend, self.ctx = model, backend, ctx
        pool, attn = backend.kv_pool, backend.attn
        self.inputs = StaticInputs(n, pool.dummy_page * pool.page_size, device)
        heads = (n, attn.num_qo_heads, attn.head_dim)
        self.q = torch.zeros(heads, dtype=attn.dtype, device=device)
        self.attn_out = torch.zeros(heads, dtype=attn.dtype, device=device)
        self.buckets: dict[int, tuple[list[torch.cuda.CUDAGraph], torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()  # mixed.py's graphs share it
        self._capturing: list[torch.cuda.CUDAGraph] | None = None
        self._capture(device)

    # ---- the attention backend's side of a capture (FlashInferBackend.forward) ----

    def q_out(self, tokens: int) -> torch.Tensor:
        """Where the layer's rotated q goes: the static buffer the replay's attention reads."""
        return self.q[:tokens]

    def cut(self, layer_id: int, tokens: int) -> torch.Tensor:
        """End the piece that ran up to layer `layer_id`'s KV store and start the next ->
        the static attention output that piece reads (filled between them at replay)."""
        if self._capturing is not None:
            assert len(self._capturing) == layer_id + 1, (len(self._capturing), layer_id)
            self._capturing[-1].capture_end()
            self._capturing.append(torch.cuda.CUDAGraph())
            self._capturing[-1].capture_begin(pool=self.pool)
        return self.attn_out[:tokens]

    # ---- capture and replay ----

    def _capture(self, device: torch.device) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(device)[0]
        stream = torch.cuda.Stream(device)
        self.backend.cut = self
        try:
            for size in reversed(self.sizes):
                batch = self.inputs.batch(size, [size])
                ids, pos = batch.input_ids, batch.positions
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.inference_mode(), self.ctx.forward_batch(batch), \
                        torch.cuda.stream(stream):
                    self.model.model(ids, pos)  # warm-up (cuBLAS, Triton), attention skipped
                    self._capturing = [torch.cuda.CUDAGraph()]
                    self._capturing[0].capture_begin(pool=self.pool)
                    hidden = self.model.model(ids, pos)
                    self._capturing[-1].capture_end()
                torch.cuda.current_stream(device).wait_stream(stream)
                self.buckets[size] = (self._capturing, hidden)
                self._capturing = None
        finally:
            self.backend.cut = None
            self._capturing = None
        torch.cuda.synchronize(device)
        pieces = sum(len(g) for g, _ in self.buckets.values())
        logger.info("captured piecewise CUDA graphs for batches with prompt tokens: %d buckets "
                    "(%d..%d tokens), %d pieces in %.1f s, %.0f MiB", len(self.sizes),
                    self.sizes[0], self.sizes[-1], pieces, time.perf_counter() - t0,
                    (free0 - torch.cuda.mem_get_info(device)[0]) / 2**20)

    def can_run(self, batch: Batch) -> bool:
        return batch.phase != "decode" and bucket_for(self.sizes, batch.num_tokens) is not None

    def run(self, batch: Batch, logits_indices: torch.Tensor) -> torch.Tensor:
        """Plan the batch's attention, replay its bucket's pieces with the attention between
        them -> the logits (B, V) of the rows `logits_indices`."""
        n = batch.num_tokens
        size = bucket_for(self.sizes, n)
        assert size is not None, f"no bucket for {n} tokens: check can_run first"
        self.inputs.load(batch, size)
        self.backend.prepare_metadata(batch)
        pieces, hidden = self.buckets[size]
        q, out = self.q[:n], self.attn_out[:n]
        attn, kv = self.backend.attn, self.backend.kv_pool
        for layer, piece in enumerate(pieces[:-1]):
            piece.replay()
            attn.run(q, kv.k[layer], kv.v[layer], out=out)
        pieces[-1].replay()
        return self.model.logits(hidden, logits_indices)
