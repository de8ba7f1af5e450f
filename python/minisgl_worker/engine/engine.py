"""The engine owns everything on the device: model, KV pool, page table, attention backend
and sampler. `forward_batch` runs one batch and returns its sampled tokens; the scheduler
owns everything else."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch

from ..attention import create_attention_backend
from ..core import Batch, Context, clear_global_ctx, set_global_ctx
from ..kvcache import MHAKVPool
from ..models import ModelConfig, create_model
from .config import EngineConfig
from .sampler import Sampler

logger = logging.getLogger(__name__)


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # (B,) on the device, one per batch.sample_reqs
    next_tokens_cpu: list[int]
    copy_done_event: torch.cuda.Event | None  # set once next_tokens_cpu is valid (CUDA)
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        self.model_config = ModelConfig.from_hf(config.model_path)
        self.model_name = Path(config.model_path).resolve().name
        self.max_running = config.resolve_max_running(self.device)
        cfg = self.model_config
        self.model = create_model(
            config.model_path, cfg, self.dtype, self.device, config.load_format
        )
        self.page_size = config.page_size
        num_pages = self._num_pages()
        self.kv_pool = MHAKVPool(
            cfg.num_layers, num_pages, self.page_size, cfg.num_kv_heads, cfg.head_dim,
            self.dtype, self.device,
        )
        # The context a request may reach: the model's, capped so one request always fits.
        self.max_context = min(cfg.max_context, self.kv_pool.num_slots)
        self.page_table = torch.zeros(
            (self.max_running, self.max_context), dtype=torch.int32, device=self.device
        )
        self.attn_backend = create_attention_backend(
            config.attention_backend, self.kv_pool, self.page_table, cfg.head_dim**-0.5,
            cfg.num_heads,  # tp_size 1: every query head is local
        )
        self.sampler = Sampler(list(cfg.eos_token_ids), self.device)
        self.ctx = Context(self.attn_backend, self.kv_pool)
        set_global_ctx(self.ctx)
        logger.info(
            "engine ready: %s on %s (%s, %s attention), KV %d tokens (%d pages of %d), "
            "max_context %d", self.model_name, self.device, str(self.dtype).removeprefix("torch."),
            type(self.attn_backend).__name__, self.kv_pool.num_slots, num_pages,
            self.page_size, self.max_context,
        )

    def _num_pages(self) -> int:
        cfg, ps = self.model_config, self.page_size
        if self.config.kv_tokens:
            return -(-self.config.kv_tokens // ps)
        per_token = MHAKVPool.bytes_per_token(
            cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype
        )
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * self.config.gpu_memory_fraction)
        else:
            budget = self.config.cpu_kv_bytes
        # No point holding more than every running request at full context.
        tokens = min(budget // per_token, self.max_running * cfg.max_context)
        assert tokens >= ps, f"no memory left for the KV cache ({budget} bytes)"
        return tokens // ps

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> ForwardOutput:
        self.attn_backend.prepare_metadata(batch)
        indices = torch.tensor(batch.last_token_indices, dtype=torch.long, device=self.device)
        with self.ctx.forward_batch(batch):
            logits = self.model(batch.input_ids, batch.positions, indices)  # (B, V)
        sample = self.sampler.sample(logits, batch.sample_reqs)
        tokens_gpu = sample.tokens
        event = None
        if self.device.type == "cuda":
            # Non-blocking copy; the (later overlap) scheduler waits on the event.
            tokens_cpu_t = tokens_gpu.to("cpu", non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            event.synchronize()
        else:
            tokens_cpu_t = tokens_gpu
        return ForwardOutput(
            tokens_gpu, tokens_cpu_t.tolist(), event, sample.logprobs, sample.top_logprobs
        )

    def shutdown(self) -> None:
        clear_global_ctx()
