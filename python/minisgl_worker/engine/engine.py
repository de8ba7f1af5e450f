"""The engine owns everything on the device: model, KV pool, page table, attention backend,
CUDA graphs and sampler. `forward_batch` runs one batch and returns its sampled tokens
without waiting for them (`ForwardOutput.tokens()` waits); the scheduler owns the rest.

Construction reads in the order things are decided: the route table (which graphs exist;
route.py), the kernels the model is built with (kernels.py), the model, the KV pool sized
by what is left (memory.py; an FP8 pool's scales from kv_scales.py), the attention backend,
and the graphs (graphs/). A batch then
takes one route (`RouteTable.route`) and that route's runner runs it. On CPU everything is
torch-native and eager."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from ..attention import GraphAttnBackend, create_attention_backend, resolve_backend_name
from ..constrain import ReadyMasks
from ..context import Context, clear_global_ctx, set_global_ctx
from ..core import Batch, RouteKind
from ..distributed import get_comm, get_tp_info
from ..kvcache import MHAKVPool
from ..models import ModelConfig, create_model
from ..startup import Stages
from ..transfer import to_device
from .config import EngineConfig
from .graphs import Eager, Runner, capture_graphs
from .kernels import choose_kernels, fused_kernels
from .kv_scales import calibrate
from .memory import KVMemoryError, available_ram, check_kv_fits, plan_kv_memory
from .route import Gpu, RouteTable, build_table
from .sampler import Sampler

logger = logging.getLogger(__name__)


class ForwardOutput(NamedTuple):
    tokens_cpu: torch.Tensor  # (B,) host (pinned on CUDA), valid once the event is set
    copy_done_event: torch.cuda.Event | None  # set once tokens_cpu is valid (CUDA)
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]

    def tokens(self) -> list[int]:
        """The sampled tokens on the host; waits for this batch's copy only."""
        if self.copy_done_event is not None:
            self.copy_done_event.synchronize()
        return self.tokens_cpu.tolist()


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        stages = Stages(logger)
        self.config = config
        self.device = device = config.resolve_device()
        self.dtype = config.resolve_dtype(device)
        self.model_config = cfg = ModelConfig.from_hf(config.model_path)
        if cfg.sliding_window is not None:
            logger.warning("the model's sliding window (%d tokens) caps its context: attention "
                           "here reads the whole context", cfg.sliding_window)
        self.tp = tp = get_tp_info()
        # This rank's heads and MLP columns: what the KV pool, attention and kernels see.
        self.rank_config = rcfg = cfg.per_rank(tp.size)
        self.comm = get_comm() if tp.size > 1 else None
        self.model_name = Path(config.model_path).resolve().name
        self.max_running = config.resolve_max_running(device)
        self.page_size = config.resolve_page_size()
        self.backend_name = resolve_backend_name(config.attention_backend, device)
        self.kv_dtype = config.resolve_kv_dtype(self.dtype)
        fused = fused_kernels(self.backend_name, self.dtype)
        gpu = Gpu.of(device) if device.type == "cuda" else None
        self.routes: RouteTable = build_table(config, rcfg, self.backend_name == "flashinfer",
                                              fused, gpu, self.max_running)
        sizes = self.routes.sizes
        self.kernels = choose_kernels(rcfg, fused, self.dtype, self.kv_dtype, device,
                                      self.page_size, sizes.decode, config.gemm)
        if device.type == "cuda":
            stages.done("kernels ready", "FlashInfer's JIT builds once, then loads from its cache")
        self.model = create_model(config.model_path, cfg, self.dtype, device,
                                  config.load_format, self.kernels)
        params = sum(p.numel() for p in self.model.parameters())
        stages.done("model loaded", f"{params / 1e6:,.0f}M parameters on this rank, "
                    f"{str(self.dtype).removeprefix('torch.')}, {config.load_format}")
        num_pages = self._num_pages()
        scales = None
        if self.kv_dtype != self.dtype:
            scales = calibrate(self.model, rcfg, self.backend_name, self.routes, self.dtype,
                               device, self.page_size)
        self.kv_pool = MHAKVPool(cfg.num_layers, num_pages, self.page_size, rcfg.num_kv_heads,
                                 cfg.head_dim, self.kv_dtype, device, scales)
        stages.done("KV cache sized", f"{self.kv_pool.num_slots:,} tokens of "
                    f"{str(self.kv_dtype).removeprefix('torch.')}")
        # The context a request may reach: the model's, capped so one request always fits.
        self.max_context = min(cfg.max_context, self.kv_pool.num_slots)
        self.page_table = torch.zeros((self.max_running, self.max_context), dtype=torch.int32,
                                      device=device)
        self.attn_backend = create_attention_backend(
            self.backend_name, self.kv_pool, self.page_table, cfg.head_dim**-0.5,
            rcfg.num_heads, self.dtype,
        )
        # The last sampled token of each request slot: a decode's input when the host does
        # not have it yet (overlap scheduling; see scheduler.py), and the penalties' too.
        self.token_pool = torch.zeros(self.max_running, dtype=torch.long, device=device)
        self.sampler = Sampler(list(cfg.eos_token_ids), device, self.token_pool)
        self.ctx = Context(self.attn_backend)
        set_global_ctx(self.ctx)
        self.runners = self._runners(stages)
        self._log_ready()

    def _runners(self, stages: Stages) -> dict[RouteKind, Runner]:
        """The eager runner, and the CUDA graphs the route table sizes (captured here)."""
        sizes = self.routes.sizes
        runners: dict[RouteKind, Runner] = {
            RouteKind.EAGER: Eager(self.model, self.attn_backend, self.ctx)}
        if sizes.any:
            assert isinstance(self.attn_backend, GraphAttnBackend)
            runners |= capture_graphs(
                self.model, self.attn_backend, self.ctx, sizes,
                self.kv_pool.dummy_page * self.page_size, -(-self.max_context // self.page_size),
                self.device)
            stages.done("CUDA graphs captured")
        return runners

    def _log_ready(self) -> None:
        sizes, pool = self.routes.sizes, self.kv_pool
        logger.info(
            "engine ready: %s on %s (%s, %s attention, %s GEMMs, CUDA graphs: decode to batch "
            "%d, piecewise %s, mixed-step to %d tokens), KV %d tokens of %s (%d pages of %d), "
            "max_context %d", self.model_name, self.device, str(self.dtype).removeprefix("torch."),
            type(self.attn_backend).__name__, "tuned" if self.kernels.gemm else "cuBLAS",
            sizes.decode[-1] if sizes.decode else 0,
            f"{sizes.pieces[0]}..{sizes.pieces[-1]}" if sizes.pieces else "none",
            sizes.mixed[-1] if sizes.mixed else 0, pool.num_slots,
            str(self.kv_dtype).removeprefix("torch."), pool.num_pages,
            self.page_size, self.max_context)

    def _num_pages(self) -> int:
        """KV pages on this rank; in a TP group, the fewest any rank can hold (every rank
        runs the same batches). A rank with no room still joins that agreement, so that no
        rank waits for it, and then every rank raises."""
        try:
            pages, error = self._rank_pages(), None
        except KVMemoryError as e:
            pages, error = 0, e
        if self.tp.size > 1:
            pages = get_comm().min_int(pages)
        if error is not None:
            raise error
        if pages == 0:
            raise KVMemoryError("another rank of this TP group has no room for the KV cache "
                                "(its own error says why)")
        return pages

    def _rank_pages(self) -> int:
        cfg, ps = self.rank_config, self.page_size
        per_token = MHAKVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                              self.kv_dtype)
        budget, free, where = self._kv_budget(per_token)
        if self.config.kv_tokens:
            check_kv_fits(self.config.kv_tokens, per_token, free, where)
            return -(-self.config.kv_tokens // ps)
        # No point holding more than every running request at full context.
        tokens = min(budget // per_token, self.max_running * cfg.max_context)
        if tokens < ps:
            raise KVMemoryError(
                f"no room for one page of KV cache ({ps} tokens) {where}: "
                f"{max(budget, 0) / 2**30:.2f} GiB")
        return tokens // ps

    def _kv_budget(self, per_token: int) -> tuple[int, int | None, str]:
        """-> (the bytes the KV cache gets by default, the most an explicit --kv-tokens may
        take (None: unknown), where that memory is, for errors)."""
        if self.device.type != "cuda":
            ram = available_ram()
            shared = None if ram is None else ram // self.tp.size
            return (self.config.cpu_kv_bytes, shared,
                    f"in host memory (available, shared by {self.tp.size} rank(s))")
        sizes = self.routes.sizes
        plan = plan_kv_memory(
            self.model, self.rank_config, self.backend_name, self.routes, self.dtype,
            self.device, self.page_size, self.config.chunk_size,
            sizes.decode[-1] if sizes.decode else 0, sizes.pieces + sizes.mixed,
            self.max_running,
        )
        budget = plan.within(self.config.gpu_memory_fraction)
        logger.info(
            "GPU memory: %.2f GiB in use before KV (weights, other processes ...), prefill peak "
            "%.2f GiB, CUDA-graph reserve %.2f GiB -> KV %.2f GiB = %d tokens%s",
            plan.weights_and_rest / 2**30, plan.prefill_peak / 2**30,
            plan.graph_reserve / 2**30, budget / 2**30, max(budget, 0) // per_token,
            f" (--kv-tokens {self.config.kv_tokens} asked)" if self.config.kv_tokens else "")
        return budget, plan.kv_bytes, (
            f"on {self.device} (the card less what is in use, this process's or others', the "
            "activations, CUDA graphs and a 2 GiB margin)")

    @torch.inference_mode()
    def forward_batch(self, batch: Batch,
                      masks: Callable[[], ReadyMasks | None] | None = None) -> ForwardOutput:
        """masks: called by the sampler, once the forward is queued, when it needs the
        grammar masks, which may be being filled ahead (the scheduler may wait for the last
        batch's tokens, process them, book this batch and plan the next meanwhile:
        scheduler.py)."""
        if batch.pool_index is not None:
            batch.input_ids[batch.pool_index] = self.token_pool[batch.pool_slots]
        route = self.routes.route(batch)
        logits = self.runners[route.kind].run(batch, route)  # (B, V), the sampling rows
        sample = self.sampler.sample(logits, batch.sample_reqs, masks)
        tokens = sample.tokens
        if self.comm is not None:
            # Every rank keeps rank 0's draw: the ranks' host RNGs differ, and a rank that
            # sampled otherwise would schedule other batches from then on.
            self.comm.broadcast(tokens)
        if batch.sample_reqs:
            rows = batch.sample_rows
            if rows is None:
                rows = to_device([r.table_idx for r in batch.sample_reqs], self.device)
            self.token_pool[rows] = tokens
        event = None
        if self.device.type == "cuda":
            # Non-blocking copy into pinned memory; `tokens()` waits on the event.
            tokens_cpu = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            tokens_cpu.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            tokens_cpu = tokens
        return ForwardOutput(tokens_cpu, event, sample.logprobs, sample.top_logprobs)

    def shutdown(self) -> None:
        self.runners.clear()
        clear_global_ctx()
