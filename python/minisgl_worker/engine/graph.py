"""Decode CUDA graphs, one per padded batch size (mini-sglang's sizes: 1, 2, 4, then every
multiple of 8 up to the maximum).

A decode step launches ~10 kernels per layer; at small models the launch gaps are most of
the step, so each size's whole forward (embedding to float32 logits) is captured once at
start and replayed. All graphs read one set of static buffers (input ids, positions, KV
slots) and share one memory pool (captured largest first, so the smaller ones fit in its
blocks) and write their logits into one shared buffer. A batch of B requests runs the
smallest graph of size >= B; the padding rows read token 0 at position 0, write their KV
into the pool's dummy page and attend over it only. Attention is re-planned for the padded
batch before every replay (`plan_cuda_graph`).

Sizes from WHOLE_KV_MIN_BS up have a second graph whose attention does not split the KV
(attention/triton_decode.py: no merge kernel, longest requests first): the backend picks it
per step when the batch's lengths are even enough (`FlashInferBackend.split_kv_for`)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from ..attention.flashinfer_backend import FlashInferBackend
from ..core import Batch, Context
from .static_inputs import StaticInputs

logger = logging.getLogger(__name__)

ModelFn = Callable[..., torch.Tensor]  # (input_ids, positions, logits_indices, logits_out)
# x KV heads: enough (request, head) programs to fill an H200 unsplit. At 37 requests the
# whole-KV kernel took 75.6 us against FlashInfer's split-KV 87.5 (benches/triton_decode.py).
WHOLE_KV_MIN_BS = 32


def graph_batch_sizes(max_bs: int) -> list[int]:
    return [s for s in (1, 2, 4) if s <= max_bs] + list(range(8, max_bs + 1, 8))


class GraphRunner:
    def __init__(
        self, model: ModelFn, backend: FlashInferBackend, ctx: Context, max_bs: int,
        max_pages_per_req: int, device: torch.device,
    ) -> None:
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.backend = backend
        pool = backend.kv_pool
        self.inputs = StaticInputs(self.max_bs, pool.dummy_page * pool.page_size, device)
        self.indices = torch.arange(self.max_bs, device=device)
        from ..attention import triton_decode  # imports triton: CUDA only

        whole_kv = [s for s in self.sizes if s >= WHOLE_KV_MIN_BS]
        if not backend.attn.use_tensor_cores or not triton_decode.supports(backend.attn.head_dim):
            whole_kv = []
        variants = backend.attn.init_cuda_graphs(self.sizes, self.max_bs * max_pages_per_req,
                                                 whole_kv)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.logits = torch.empty(0)  # (max_bs, V), shaped by the first warm-up
        self._capture(model, ctx, device, variants[::-1])  # largest first

    def _capture(self, model: ModelFn, ctx: Context, device: torch.device,
                 variants: list[tuple[int, bool]]) -> None:
        t0, free0 = time.perf_counter(), torch.cuda.mem_get_info(device)[0]
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        bar = tqdm(variants, desc="capturing CUDA graphs", file=sys.stderr, unit="graph")
        for bs, split in bar:
            bar.set_postfix(bs=bs, split_kv=split)
            batch = self.inputs.batch(bs, [1] * bs)
            self.backend.plan_padded(batch, bs, split)
            args = (batch.input_ids, batch.positions, self.indices[:bs])
            graph = torch.cuda.CUDAGraph()
            with ctx.forward_batch(batch):
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    out = model(*args)  # warm-up outside capture (lazy inits, cuBLAS workspace)
                    if not self.logits.numel():
                        self.logits = out.new_empty(self.max_bs, out.shape[1])
                torch.cuda.current_stream(device).wait_stream(stream)
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    model(*args, self.logits[:bs])
            self.graphs[bs, split] = graph
        torch.cuda.synchronize(device)
        used = free0 - torch.cuda.mem_get_info(device)[0]
        logger.info("captured %d decode CUDA graphs (batch 1..%d, %d of them without split-KV) "
                    "in %.1f s, %.0f MiB", len(self.graphs), self.max_bs,
                    len(self.graphs) - len(self.sizes), time.perf_counter() - t0, used / 2**20)

    def can_run(self, batch: Batch) -> bool:
        return batch.size <= self.max_bs and batch.phase == "decode"

    def replay(self, batch: Batch) -> torch.Tensor:
        """Run a decode batch through the graph of the next size up -> logits (B, V)."""
        bs = batch.size
        padded = next(s for s in self.sizes if s >= bs)
        self.inputs.load(batch, padded)
        split = self.backend.split_kv_for(batch, padded)
        self.backend.plan_padded(batch, padded, split)
        self.graphs[padded, split].replay()
        return self.logits[:bs]
