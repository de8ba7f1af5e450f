"""How many KV tokens fit on a GPU.

The KV pool gets what is left of the card (`MemoryPlan.kv_bytes`; of `gpu_memory_fraction`
of it by default, `MemoryPlan.within`) after everything else the engine holds: the weights
(already allocated when this runs), the activations of the largest forward (a prefill of
one full chunk, measured by running it once on a throwaway KV pool), the decode CUDA graphs
(their memory pool holds the activations of the largest graph's batch, measured the same
way, plus the sampler's (B, V) float32 temporaries), the piecewise graphs (the activations
of their largest bucket, measured the same way, plus each bucket's final hidden states),
the page table, and a fixed margin for the attention workspace, cuBLAS and fragmentation."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ..attention import create_attention_backend
from ..context import Context, clear_global_ctx, set_global_ctx
from ..core import Batch, Req, SamplingParams
from ..kvcache import MHAKVPool
from ..models import ModelConfig
from .route import RouteTable

logger = logging.getLogger(__name__)

MARGIN_BYTES = 2 << 30  # FlashInfer workspaces, cuBLAS, allocator fragmentation


class KVMemoryError(ValueError):
    """The KV cache asked for (or the least one) does not fit: a start-up error, one line."""


def check_kv_fits(tokens: int, per_token: int, free_bytes: int | None, where: str) -> None:
    """Raise KVMemoryError when `tokens` of KV (`per_token` bytes each) outsize
    `free_bytes` (None: unknown, not checked); `where` names that memory and its limit."""
    if free_bytes is None or tokens * per_token <= free_bytes:
        return
    fits = max(free_bytes, 0) // per_token
    raise KVMemoryError(
        f"--kv-tokens {tokens:,} needs {tokens * per_token / 2**30:.2f} GiB of KV cache, but "
        f"{max(free_bytes, 0) / 2**30:.2f} GiB is left for it {where}: at most {fits:,} tokens "
        "fit")


def available_ram() -> int | None:
    """The host memory the kernel reports available (MemAvailable), within this process's
    cgroup (v2) limit when it has one, or None when neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f
                      if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


class MemoryPlan(NamedTuple):
    kv_bytes: int  # the most the KV pool can take: the card less all the rest
    prefill_peak: int
    graph_reserve: int
    weights_and_rest: int  # memory in use before the KV pool (weights, CUDA context, ...)
    card_bytes: int

    def within(self, fraction: float) -> int:
        """The KV pool's bytes when the engine may hold only `fraction` of the card."""
        return self.kv_bytes - int(self.card_bytes * (1 - fraction))


def fresh_requests(tokens: int, max_len: int) -> list[int]:
    """`tokens` prompt tokens as the extend lengths of fresh requests of at most `max_len`
    each: a profiling forward of more tokens than the model's context then keeps every
    position inside it (the RoPE table ends there)."""
    whole, rest = divmod(tokens, max_len)
    return [max_len] * whole + ([rest] if rest else [])


@contextmanager
def scratch_forward(
    model: nn.Module, cfg: ModelConfig, backend_name: str, routes: RouteTable,
    dtype: torch.dtype, device: torch.device, page_size: int, extend_lens: list[int],
    input_ids: torch.Tensor | None = None,
) -> Iterator[tuple[MHAKVPool, Callable[[], torch.Tensor]]]:
    """A batch of fresh requests extending by `extend_lens` (token ids `input_ids`, default
    0) on a throwaway KV pool just big enough -> (the pool, a function that runs the batch's
    forward: logits of each last token). Everything is freed on exit."""
    assert max(extend_lens) <= cfg.max_context, (max(extend_lens), cfg.max_context)
    pages = [-(-n // page_size) for n in extend_lens]
    pool = MHAKVPool(cfg.num_layers, sum(pages), page_size, cfg.num_kv_heads, cfg.head_dim,
                     dtype, device)
    table = torch.zeros(len(extend_lens), max(pages) * page_size, dtype=torch.int32,
                        device=device)
    reqs, locs, start = [], [], 0
    for i, (n, p) in enumerate(zip(extend_lens, pages)):
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32, device=device)
        locs.append(torch.arange(start, start + n, device=device))
        req = Req(-1 - i, [0] * n, SamplingParams())
        req.table_idx, req.device_len = i, n
        reqs.append(req)
        start += p * page_size
    backend = create_attention_backend(backend_name, pool, table, cfg.head_dim**-0.5,
                                       cfg.num_heads, dtype)
    total = sum(extend_lens)
    ids = input_ids if input_ids is not None else torch.zeros(total, dtype=torch.long)
    batch = Batch(reqs=reqs, input_ids=ids.to(device),
                  positions=torch.cat([torch.arange(n, device=device) for n in extend_lens]),
                  out_loc=torch.cat(locs), extend_lens=list(extend_lens), sample_reqs=reqs)
    indices = torch.tensor(batch.last_token_indices, device=device)
    ctx = Context(backend)

    def forward() -> torch.Tensor:
        backend.prepare(batch, routes.eager(batch))
        with torch.inference_mode(), ctx.forward_batch(batch):
            return model(batch.input_ids, batch.positions, indices)

    set_global_ctx(ctx)
    try:
        yield pool, forward
    finally:
        clear_global_ctx()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # (the caller drops the pool; the rest goes with us)


def profile_forward(
    model: nn.Module, cfg: ModelConfig, backend_name: str, routes: RouteTable,
    dtype: torch.dtype, device: torch.device, page_size: int, extend_lens: list[int],
) -> int:
    """Peak bytes allocated by one forward of a batch of fresh requests extending by
    `extend_lens` (`scratch_forward`)."""
    with scratch_forward(model, cfg, backend_name, routes, dtype, device, page_size,
                         extend_lens) as (_, forward):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        forward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base


def plan_kv_memory(
    model: nn.Module, cfg: ModelConfig, backend_name: str, routes: RouteTable, dtype: torch.dtype,
    device: torch.device, page_size: int, chunk_size: int, graph_bs: int,
    graph_sizes: list[int], max_running: int,
) -> MemoryPlan:
    prefill_tokens = min(chunk_size, cfg.max_context)
    prefill_peak = profile_forward(model, cfg, backend_name, routes, dtype, device, page_size,
                                   [prefill_tokens])
    graph_reserve = 0
    if graph_bs:
        decode_peak = profile_forward(model, cfg, backend_name, routes, dtype, device, page_size,
                                      [1] * graph_bs)
        graph_reserve = decode_peak + 4 * graph_bs * cfg.vocab_size * 4  # + sampler temps
    if graph_sizes:  # the piecewise buckets (piece_sizes); the largest is often the chunk
        top = max(graph_sizes)
        graph_reserve += prefill_peak if top == prefill_tokens else profile_forward(
            model, cfg, backend_name, routes, dtype, device, page_size,
            fresh_requests(top, cfg.max_context))
        graph_reserve += sum(graph_sizes) * cfg.hidden_size * dtype.itemsize
    free, total = torch.cuda.mem_get_info(device)
    in_use = total - free
    table_bytes = max_running * cfg.max_context * 4
    kv_bytes = total - in_use - prefill_peak - graph_reserve - table_bytes - MARGIN_BYTES
    return MemoryPlan(kv_bytes, prefill_peak, graph_reserve, in_use, total)
