"""The FlashInfer attention backend the engine plugs in (CUDA only; flashinfer is imported
lazily, never on the CPU path): `FlashInferBackend` takes the same inputs as
`TorchNativeBackend` plus the query head count, turns each batch's page-table rows into
FlashInfer's paged-KV metadata (`paged_kv_meta`) and runs the kernels of
flashinfer_kernels.py (and, for mixed graphs, mixed_graph.py) over the pool's per-layer
caches: the kernels the batch's route names (engine/route.py). An FP8 pool is written with
each layer's scales (rope_store.py) and read with them (`FlashInferPagedAttention.run`).
"""

from __future__ import annotations

import torch

from ..context import get_global_ctx
from ..core import Attn, Batch, Route, RouteKind
from ..kvcache import MHAKVPool
from .base import GraphAttnBackend, GraphBreak, Rope
from .flashinfer_kernels import FlashInferPagedAttention, PrefillBackend
from .flashinfer_meta import gather_pages, paged_kv_meta
from .mixed_graph import MixedGraphAttention
from .rope_store import rope_and_store


class FlashInferBackend(GraphAttnBackend):
    """The engine's plug: `prepare` plans, `forward` stores k/v then attends."""

    def __init__(
        self, kv_pool: MHAKVPool, page_table: torch.Tensor, scale: float, num_qo_heads: int,
        prefill_backend: PrefillBackend = "auto", dtype: torch.dtype | None = None,
    ) -> None:
        """dtype: the model's (q's); None: the pool's, which must then not be FP8."""
        num_kv_heads, head_dim = kv_pool.k.shape[3:]
        assert dtype is not None or not kv_pool.quantized, "an FP8 pool needs the model dtype"
        self.kv_pool = kv_pool
        self.page_table = page_table
        self.attn = FlashInferPagedAttention(
            num_qo_heads, num_kv_heads, head_dim, kv_pool.page_size, dtype or kv_pool.dtype,
            kv_pool.k.device, sm_scale=scale, prefill_backend=prefill_backend,
            kv_dtype=kv_pool.dtype,
        )
        self.mixed_graph: MixedGraphAttention | None = None
        self._graph_break: GraphBreak | None = None  # capturing piecewise graphs

    def init_capture_graph(self, decode_sizes: list[int], whole_kv_sizes: list[int],
                           mixed_sizes: list[int], max_pages_per_req: int) -> None:
        if decode_sizes:
            self.attn.init_cuda_graphs(decode_sizes, max(decode_sizes) * max_pages_per_req,
                                       whole_kv_sizes)
        if mixed_sizes:
            self.mixed_graph = MixedGraphAttention(self.attn, self.page_table, mixed_sizes,
                                                   self.kv_pool.dummy_page, max_pages_per_req)

    def prepare(self, batch: Batch, route: Route) -> None:
        self._graph_break = None
        rows, kv_lens = batch.table_rows, batch.kv_lens
        if route.kind is RouteKind.DECODE_GRAPH:
            self._plan_padded(rows, kv_lens, route.size, route.attn is Attn.SPLIT_KV)
        elif route.kind is RouteKind.MIXED_GRAPH:
            assert self.mixed_graph is not None, "init_capture_graph with mixed sizes first"
            self.mixed_graph.plan(route.size, rows, kv_lens, batch.extend_lens)
        else:
            meta = paged_kv_meta(self.page_table, rows, kv_lens, batch.extend_lens,
                                 self.kv_pool.page_size)
            self.attn.plan(route.attn, *meta)

    def prepare_for_capture(self, batch: Batch, route: Route,
                            graph_break: GraphBreak | None = None) -> None:
        assert not batch.reqs, "graphs are captured with request-less batches"
        if route.kind is RouteKind.DECODE_GRAPH:
            self._plan_padded([], [], route.size, route.attn is Attn.SPLIT_KV)
        elif route.kind is RouteKind.MIXED_GRAPH:
            # One row a request, every request on the dummy page: FA2's tile is fixed here
            # (mixed_graph.py).
            assert self.mixed_graph is not None, "init_capture_graph with mixed sizes first"
            n = route.size
            self.mixed_graph.plan(n, [-1] * n, [1] * n, [1] * n)
        self._graph_break = graph_break
        assert route.kind is not RouteKind.PIECEWISE or graph_break is not None

    def _plan_padded(self, rows: list[int], kv_lens: list[int], padded_bs: int,
                     split_kv: bool) -> None:
        """Plan a decode batch for the CUDA graph of size padded_bs >= its size (the
        whole-KV variant when not `split_kv`): each padding row attends over one token of
        the pool's dummy page. The page ids go straight into the graphs' buffer in one
        launch (page_ids.py); the indptr and last-page lengths stay on the host."""
        pad = padded_bs - len(rows)
        indptr, last = gather_pages(
            self.page_table, rows + [-1] * pad, kv_lens + [1] * pad, self.kv_pool.page_size,
            self.kv_pool.dummy_page, self.attn.graph_page_ids())
        self.attn.plan_cuda_graph(torch.from_numpy(indptr),
                                  self.attn.graph_page_ids(int(indptr[-1])),
                                  torch.from_numpy(last), split_kv)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        batch, cut = get_global_ctx().batch, self._graph_break
        if cut is not None:  # capturing piecewise graphs: attention runs between the pieces
            rope_and_store(self.kv_pool, layer_id, batch.out_loc, q, k, v, rope,
                           cut.q_out(q.shape[0]))
            return cut.cut(layer_id, q.shape[0])
        q = rope_and_store(self.kv_pool, layer_id, batch.out_loc, q, k, v, rope)
        # q may be a strided view of the fused qkv output (in-place RoPE): FlashInfer's
        # kernels take its row and head strides, so it is not copied.
        pool = self.kv_pool
        return self.attn.run(q, pool.k[layer_id], pool.v[layer_id],
                             scales=pool.scales(layer_id))

    def attend(self, layer_id: int, q: torch.Tensor, out: torch.Tensor) -> None:
        pool = self.kv_pool
        self.attn.run(q, pool.k[layer_id], pool.v[layer_id], out=out,
                      scales=pool.scales(layer_id))
