"""Which way a batch goes through the engine: one table of rules, in `RouteTable.route`.

| rule, in order | route | attention |
| --- | --- | --- |
| every request decodes (one token) and a decode graph holds the batch | DECODE_GRAPH, the smallest size >= B | WHOLE_KV when that size has the variant (>= WHOLE_KV_MIN_BS) and no request is longer than twice the mean, else SPLIT_KV |
| a mixed-graph size holds the T tokens (<= BUCKET - 1 padding rows), >= `min_requests` requests, and T x GQA group <= QUERY_TILE x B | MIXED_GRAPH, that size | MIXED_FA2 (captured) |
| not all decodes, and a piecewise bucket holds the T tokens (<= BUCKET - 1 padding rows) | PIECEWISE, that bucket | eager, planned for the real batch |
| anything else | EAGER | eager |

Eager attention (`RouteTable.eager_attn`): TORCH on the torch backend; else DECODE when
every request extends by one token, PREFILL when none leads with one, MIXED_FA2 (one FA2
launch) when decode runs on tensor cores and at most ONE_LAUNCH_MAX_PROMPT_ROWS rows are
prompt rows, else DECODE_THEN_PREFILL (the decode kernel on the leading decodes, the
prefill kernel, FA3 on SM90, on the rest). An FP8 KV cache takes the same routes: every
kernel named here reads it (FA2 instead of FA3 for prompt rows, as FlashInfer's FA3 reads
FP8 KV only with an FP8 query; the whole-KV Triton decode upcasts its tiles).

Why each threshold:
- WHOLE_KV: without a split each (request, KV head) is one CTA, so the longest request sets
  the kernel's time; from 32 requests x KV heads the CTAs fill an H200 unsplit (at 37
  requests the whole-KV kernel took 75.6 us against FlashInfer's split-KV 87.5).
- MIXED_GRAPH: in graph mode FA2 fixes its plan at capture (a 16-row query tile, no split of
  long KV; attention/mixed_graph.py), so the graphs take only the steps whose eager plan is
  that one: FA2's eager plan picks the 16-row tile when the mean request's packed query
  (tokens x GQA group) is at most 16, and leaves long KV unsplit once its tiles (at least
  one a request) overflow 2 CTAs a SM per KV head (scheduler.cuh, `min_requests`).
- ONE_LAUNCH_MAX_PROMPT_ROWS: beyond it FA3 (SM90) is worth its second launch for the
  prompt rows; FA3 reads a one-token query 2-5x slower than the decode kernel.
- BUCKET: a batch never pays for more than 15 padding rows (a 600-token step does not
  replay an 8,192-token bucket).

The sizes (`GraphSizes`) are what the engine captured (`build_table`); a table without
sizes routes everything eagerly (CPU, torch attention, `--cuda-graph-max-bs 0`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..core import Attn, Batch, Route, RouteKind

if TYPE_CHECKING:
    from ..models import ModelConfig
    from .config import EngineConfig

BUCKET = 16  # token-count granularity of the piecewise and mixed graphs
QUERY_TILE = 16  # the packed query rows (tokens x GQA group) of the mixed graphs' FA2 tile
WHOLE_KV_MIN_BS = 32
ONE_LAUNCH_MAX_PROMPT_ROWS = 1024


def graph_batch_sizes(max_bs: int) -> list[int]:
    """The decode graphs' sizes (mini-sglang's): 1, 2, 4, then every multiple of 8."""
    return [s for s in (1, 2, 4) if s <= max_bs] + list(range(8, max_bs + 1, 8))


def piece_sizes(max_tokens: int, chunk_tokens: int = 0) -> list[int]:
    """Every multiple of BUCKET up to `max_tokens`, and `chunk_tokens` (the scheduler's
    prefill budget: a step that fills it has exactly that many tokens) when it is larger."""
    sizes = list(range(BUCKET, max_tokens + 1, BUCKET))
    return sizes + [chunk_tokens] if sizes and chunk_tokens > sizes[-1] else sizes


def bucket_for(sizes: list[int], tokens: int) -> int | None:
    """The smallest size >= tokens, if that pads fewer than BUCKET rows."""
    size = next((s for s in sizes if s >= tokens), None)
    return size if size is not None and size - tokens < BUCKET else None


def min_requests(num_sms: int, num_kv_heads: int) -> int:
    """The fewest requests for which FA2's eager plan leaves long KV unsplit: it splits
    while its tiles (at least one a request) fit in 2 CTAs a SM per KV head."""
    return 2 * num_sms // num_kv_heads + 1


@dataclass(frozen=True)
class GraphSizes:
    decode: list[int] = field(default_factory=list)  # batch sizes, ascending
    whole_kv: list[int] = field(default_factory=list)  # decode sizes with the WHOLE_KV variant
    pieces: list[int] = field(default_factory=list)  # piecewise token buckets
    mixed: list[int] = field(default_factory=list)  # mixed-graph row counts

    @property
    def any(self) -> bool:
        return bool(self.decode or self.pieces)


@dataclass(frozen=True)
class RouteTable:
    sizes: GraphSizes
    flashinfer: bool  # else torch-native attention: always TORCH, never a graph
    tensor_core_decode: bool = False  # FlashInfer runs decode on its prefill kernel (FA2)
    group: int = 1  # GQA group: query heads per KV head
    mixed_min_requests: int = 0  # `min_requests` of the GPU and the model

    def route(self, batch: Batch) -> Route:
        sizes, n, reqs = self.sizes, batch.num_tokens, batch.size
        decode = batch.phase == "decode"
        if decode and sizes.decode and reqs <= sizes.decode[-1]:
            padded = next(s for s in sizes.decode if s >= reqs)
            lens = batch.kv_lens
            even = bool(lens) and max(lens) * len(lens) <= 2 * sum(lens)
            whole = padded in sizes.whole_kv and even
            return Route(RouteKind.DECODE_GRAPH, Attn.WHOLE_KV if whole else Attn.SPLIT_KV,
                         padded)
        size = bucket_for(sizes.mixed, n)
        if (size is not None and reqs >= self.mixed_min_requests
                and n * self.group <= QUERY_TILE * reqs):
            return Route(RouteKind.MIXED_GRAPH, Attn.MIXED_FA2, size)
        size = bucket_for(sizes.pieces, n)
        if not decode and size is not None:
            return Route(RouteKind.PIECEWISE, self.eager_attn(batch.extend_lens), size)
        return self.eager(batch)

    def eager(self, batch: Batch) -> Route:
        return Route(RouteKind.EAGER, self.eager_attn(batch.extend_lens))

    def eager_attn(self, extend_lens: list[int]) -> Attn:
        if not self.flashinfer:
            return Attn.TORCH
        decodes = next((i for i, n in enumerate(extend_lens) if n != 1), len(extend_lens))
        if decodes == len(extend_lens):
            return Attn.DECODE
        if decodes == 0:
            return Attn.PREFILL
        prompt_rows = sum(extend_lens) - decodes
        if self.tensor_core_decode and prompt_rows <= ONE_LAUNCH_MAX_PROMPT_ROWS:
            return Attn.MIXED_FA2
        return Attn.DECODE_THEN_PREFILL


@dataclass(frozen=True)
class Gpu:
    """The facts of the GPU the sizes depend on."""

    memory: int  # bytes
    sms: int

    @classmethod
    def of(cls, device: torch.device) -> Gpu:
        props = torch.cuda.get_device_properties(device)
        return cls(props.total_memory, props.multi_processor_count)


def build_table(config: EngineConfig, cfg: ModelConfig, flashinfer: bool, fused: bool,
                gpu: Gpu | None, max_running: int) -> RouteTable:
    """The graphs an engine captures and the rules that route to them: decode graphs with
    FlashInfer on a GPU, piecewise and mixed graphs when the model runs fused kernels too
    (the fused RoPE kernel writes q into the piecewise graphs' static buffer), the mixed
    ones with tensor-core decode (they run FA2's prefill kernel)."""
    from ..attention.flashinfer_kernels import tensor_core_decode

    tc = flashinfer and tensor_core_decode(cfg.num_heads, cfg.num_kv_heads)
    group = cfg.num_heads // cfg.num_kv_heads
    if not flashinfer or gpu is None:
        return RouteTable(GraphSizes(), flashinfer, tc, group)
    decode = graph_batch_sizes(config.resolve_graph_max_bs(gpu.memory, max_running))
    whole_kv: list[int] = []
    if tc and decode:
        from ..attention import triton_decode  # imports triton

        if triton_decode.supports(cfg.head_dim):
            whole_kv = [s for s in decode if s >= WHOLE_KV_MIN_BS]
    graph_tokens = config.resolve_graph_max_tokens() if fused else 0
    pieces = piece_sizes(graph_tokens, config.chunk_size) if graph_tokens else []
    mixed = piece_sizes(config.resolve_graph_mixed_tokens(graph_tokens)) if pieces and tc else []
    sizes = GraphSizes(decode, whole_kv, pieces, mixed)
    return RouteTable(sizes, flashinfer, tc, group, min_requests(gpu.sms, cfg.num_kv_heads))
