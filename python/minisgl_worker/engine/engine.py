"""The engine owns everything on the device: model, KV pool, page table, attention backend,
CUDA graphs and sampler. `forward_batch` runs one batch and returns its sampled tokens
without waiting for them (`ForwardOutput.tokens()` waits); the scheduler owns the rest.

On CUDA with FlashInfer (the default there) the model runs FlashInfer's fused RMSNorm,
RoPE and SiLU-and-mul, on Hopper in bf16 its small-batch GEMMs run cuBLAS or CUTLASS
(layers/gemm.py, tuned at start), every JIT module it needs is compiled in one parallel
build at start, decode batches up to `cuda_graph_max_bs` replay CUDA graphs (graph.py), and
prefill and mixed batches up to `cuda_graph_max_tokens` tokens, or of the chunk size (a step
that fills the prefill budget), replay piecewise graphs with their attention between the
pieces (piecewise.py), except mixed batches of up to `cuda_graph_mixed_tokens` tokens with
enough requests, which replay whole graphs (mixed.py); other batches run eagerly. On CPU
everything is torch-native."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..attention import create_attention_backend, resolve_backend_name
from ..attention.base import BaseAttnBackend
from ..attention.flashinfer_kernels import tensor_core_decode
from ..core import Batch, Context, clear_global_ctx, set_global_ctx
from ..kvcache import MHAKVPool
from ..layers import ColumnParallelLinear, RowParallelLinear, gemm
from ..models import ModelConfig, create_model
from ..transfer import to_device
from .config import EngineConfig
from .graph import GraphRunner, graph_batch_sizes
from .memory import plan_kv_memory
from .mixed import MixedGraphs
from .piecewise import PiecewiseGraphs, piece_sizes
from .sampler import Sampler

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec

logger = logging.getLogger(__name__)


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # (B,) on the device, one per batch.sample_reqs
    next_tokens_cpu: torch.Tensor  # (B,) host (pinned on CUDA), valid once the event is set
    copy_done_event: torch.cuda.Event | None  # set once next_tokens_cpu is valid (CUDA)
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]

    def tokens(self) -> list[int]:
        """The sampled tokens on the host; waits for this batch's copy only."""
        if self.copy_done_event is not None:
            self.copy_done_event.synchronize()
        return self.next_tokens_cpu.tolist()


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        self.model_config = cfg = ModelConfig.from_hf(config.model_path)
        self.model_name = Path(config.model_path).resolve().name
        self.max_running = config.resolve_max_running(self.device)
        self.page_size = config.resolve_page_size(self.device)
        self.backend_name = resolve_backend_name(config.attention_backend, self.device)
        self.model = create_model(
            config.model_path, cfg, self.dtype, self.device, config.load_format
        )
        fused = self.backend_name == "flashinfer" and self.dtype != torch.float32
        graph_bs = config.resolve_graph_max_bs(self.device, self.max_running)
        if self.backend_name != "flashinfer":
            graph_bs = 0
        gemm_spec = None
        if fused and graph_bs > 0 and gemm.supported(self.device, self.dtype):
            gemm_spec = gemm.jit_spec()
        if fused:
            self.model.use_fused_ops()
            if not self._build_jit([gemm_spec] if gemm_spec else []):
                gemm_spec = None
        if gemm_spec is not None:
            self._tune_gemms(gemm_spec, graph_batch_sizes(graph_bs))
        # Piecewise graphs need the fused RoPE kernel (it writes q into their static buffer).
        graph_tokens = config.resolve_graph_max_tokens(self.device) if fused else 0
        bucket_sizes = piece_sizes(graph_tokens, config.chunk_size) if graph_tokens else []
        mixed = piece_sizes(config.resolve_graph_mixed_tokens(graph_tokens))
        if not bucket_sizes or not tensor_core_decode(cfg.num_heads, cfg.num_kv_heads):
            mixed = []  # they run FA2's tensor-core kernel (mixed_graph.py)
        num_pages = self._num_pages(graph_bs, bucket_sizes + mixed)
        self.kv_pool = MHAKVPool(
            cfg.num_layers, num_pages, self.page_size, cfg.num_kv_heads, cfg.head_dim,
            self.dtype, self.device,
        )
        # The context a request may reach: the model's, capped so one request always fits.
        self.max_context = min(cfg.max_context, self.kv_pool.num_slots)
        self.page_table = torch.zeros(
            (self.max_running, self.max_context), dtype=torch.int32, device=self.device
        )
        self.attn_backend: BaseAttnBackend = create_attention_backend(
            self.backend_name, self.kv_pool, self.page_table, cfg.head_dim**-0.5,
            cfg.num_heads,  # tp_size 1: every query head is local
        )
        self.sampler = Sampler(list(cfg.eos_token_ids), self.device)
        # The last sampled token of each request slot: a decode's input when the host does
        # not have it yet (overlap scheduling; see scheduler.py).
        self.token_pool = torch.zeros(self.max_running, dtype=torch.long, device=self.device)
        self.ctx = Context(self.attn_backend, self.kv_pool)
        set_global_ctx(self.ctx)
        self.graphs: GraphRunner | None = None
        self.pieces: PiecewiseGraphs | None = None
        self.mixed: MixedGraphs | None = None
        if graph_bs or bucket_sizes:
            self._capture_graphs(graph_bs, bucket_sizes, mixed)
        logger.info(
            "engine ready: %s on %s (%s, %s attention, CUDA graphs to batch %d, piecewise "
            "buckets %s, mixed-step graphs to %d tokens), KV %d tokens (%d pages of %d), "
            "max_context %d", self.model_name,
            self.device, str(self.dtype).removeprefix("torch."),
            type(self.attn_backend).__name__, graph_bs,
            f"{bucket_sizes[0]}..{bucket_sizes[-1]}" if bucket_sizes else "none",
            mixed[-1] if mixed else 0,
            self.kv_pool.num_slots,
            num_pages, self.page_size, self.max_context,
        )

    def _capture_graphs(self, graph_bs: int, bucket_sizes: list[int], mixed: list[int]) -> None:
        """Decode CUDA graphs up to batch `graph_bs` (0: none), piecewise graphs for
        steps with prompt tokens at `bucket_sizes` and whole graphs for small mixed steps at
        `mixed` sizes (FlashInfer only)."""
        from ..attention.flashinfer_backend import FlashInferBackend

        backend = self.attn_backend
        assert isinstance(backend, FlashInferBackend)
        max_pages = -(-self.max_context // self.page_size)
        if graph_bs:
            with torch.inference_mode():
                self.graphs = GraphRunner(self.model, backend, self.ctx, graph_bs, max_pages,
                                          self.device)
        if bucket_sizes:
            self.pieces = PiecewiseGraphs(self.model, backend, self.ctx, bucket_sizes,
                                          self.device)
        if mixed and self.pieces is not None:
            self.mixed = MixedGraphs(self.model, backend, self.ctx, mixed, max_pages,
                                     self.pieces.pool, self.device)

    def _build_jit(self, optional: list[JitSpec]) -> bool:
        """Compile every FlashInfer module this engine uses, and the `optional` JIT specs, in
        one parallel ninja run (restored AOT modules are skipped), before any first use
        compiles them one by one. Returns whether the optional ones were built."""
        import time

        from ..attention.flashinfer_jit import build_jit_optional
        from ..attention.flashinfer_kernels import FlashInferPagedAttention
        from ..layers import cuda_ops

        cfg, t0 = self.model_config, time.perf_counter()
        attn = FlashInferPagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                        self.page_size, self.dtype, self.device)
        built = build_jit_optional(attn.jit_specs() + cuda_ops.jit_specs(), optional)
        del attn
        logger.info("FlashInfer modules ready in %.1f s", time.perf_counter() - t0)
        return built

    @torch.inference_mode()
    def _tune_gemms(self, spec: JitSpec, sizes: list[int]) -> None:
        """Hopper, bf16: every bias-free linear runs its matmul by cuBLAS or by CUTLASS with
        PDL (the built module `spec`), whichever `gemm.Sm90Gemm.tune` measures faster at each
        decode graph's size."""
        linears = [m for m in self.model.modules()
                   if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and m.bias is None]
        tuned = gemm.Sm90Gemm.tune(spec.build_and_load(), (m.weight for m in linears), sizes)
        for m in linears:
            m.gemm = tuned
        torch.cuda.empty_cache()  # the tuning graphs' pools, before the memory plan

    def _num_pages(self, graph_bs: int, graph_sizes: list[int]) -> int:
        cfg, ps = self.model_config, self.page_size
        if self.config.kv_tokens:
            return -(-self.config.kv_tokens // ps)
        per_token = MHAKVPool.bytes_per_token(
            cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype
        )
        if self.device.type == "cuda":
            plan = plan_kv_memory(
                self.model, cfg, self.backend_name, self.dtype, self.device, ps,
                self.config.chunk_size, graph_bs, graph_sizes, self.max_running,
                self.config.gpu_memory_fraction,
            )
            budget = plan.kv_bytes
            logger.info(
                "GPU memory: %.2f GiB in use before KV (weights ...), prefill peak %.2f GiB, "
                "CUDA-graph reserve %.2f GiB -> KV %.2f GiB = %d tokens",
                plan.weights_and_rest / 2**30, plan.prefill_peak / 2**30,
                plan.graph_reserve / 2**30, budget / 2**30, max(budget, 0) // per_token,
            )
        else:
            budget = self.config.cpu_kv_bytes
        # No point holding more than every running request at full context.
        tokens = min(budget // per_token, self.max_running * cfg.max_context)
        assert tokens >= ps, f"no memory left for the KV cache ({budget} bytes)"
        return tokens // ps

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> ForwardOutput:
        if batch.pool_index is not None:
            batch.input_ids[batch.pool_index] = self.token_pool[batch.pool_slots]
        if self.graphs is not None and self.graphs.can_run(batch):
            logits = self.graphs.replay(batch)  # (B, V), every request samples
        else:
            indices = to_device(batch.last_token_indices, self.device)
            if self.mixed is not None and self.mixed.can_run(batch):
                logits = self.mixed.run(batch, indices)
            elif self.pieces is not None and self.pieces.can_run(batch):
                logits = self.pieces.run(batch, indices)
            else:
                self.attn_backend.prepare_metadata(batch)
                with self.ctx.forward_batch(batch):
                    logits = self.model(batch.input_ids, batch.positions, indices)  # (B, V)
        sample = self.sampler.sample(logits, batch.sample_reqs)
        tokens_gpu = sample.tokens
        if batch.sample_reqs:
            rows = batch.sample_rows
            if rows is None:
                rows = to_device([r.table_idx for r in batch.sample_reqs], self.device)
            self.token_pool[rows] = tokens_gpu
        event = None
        if self.device.type == "cuda":
            # Non-blocking copy into pinned memory; `tokens()` waits on the event.
            tokens_cpu = torch.empty(tokens_gpu.shape, dtype=tokens_gpu.dtype, pin_memory=True)
            tokens_cpu.copy_(tokens_gpu, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            tokens_cpu = tokens_gpu
        return ForwardOutput(tokens_gpu, tokens_cpu, event, sample.logprobs, sample.top_logprobs)

    def shutdown(self) -> None:
        self.graphs = self.pieces = self.mixed = None
        clear_global_ctx()
