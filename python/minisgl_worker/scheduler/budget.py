"""What the next step admits, and the defaults of it derived from the model and the GPU.

Order. First come, first served ("fcfs"); longest max_new_tokens first ("lof", SGLang's
name), for a batch submitted at once: the requests admitted last then finish soonest; or
shortest prompt first ("spf"), bounded: a request's key is its arrival time plus SPF_WINDOW
times its prompt's estimated compute (the tokens the prefix cache does not hold as it
arrives: a long conversation's next turn is short work), and the queue is in key order. A
prompt is then passed over only by shorter ones that arrive within that window after it
(SPF_WINDOW x its own prefill time: ~0.8 s for 1,024 tokens of Llama-3.1-8B on an H200),
never for longer.

Budget. A step takes at most `chunk_size` tokens, decodes included. A step with decodes
takes at most `mixed_chunk_size` prompt tokens, which bounds how long a prompt stalls the
running decodes: a long prompt is split across steps while decodes run, and takes the whole
chunk when none do. `mixed_step_tokens` N (0: off) caps a step at N tokens, decodes
included, once N // 4 or more requests decode (prompts still get at least N // 8 tokens a
step): prompt chunks then fill the rows that a decode step's weight-bound GEMMs leave idle,
where a prompt token costs about half what it costs in a full chunk.

Defaults (`derive`; a flag or argument given overrides each one):
- `mixed_chunk_size`, serving: the prompt tokens whose compute fits one target
  inter-token latency, TARGET_ITL_S x the GPU's bf16 FLOP/s x PREFILL_EFFICIENCY / the
  FLOPs of a prompt token (2 x the weights a token multiplies: the layers' linears; the LM
  head runs only on sampled rows), rounded down to ROUND tokens, within [ROUND, chunk].
  A running stream then waits at most about that long plus a decode step for its next
  token. Llama-3.1-8B (14.0 GFLOP a token) on an H200 (989 TFLOP/s): 50 ms -> 2,048;
  Qwen3-0.6B (0.88 GFLOP): 34k, clamped to the chunk (8,192), so it runs as before.
  Without the bound, a step at saturation on the 8B is the whole 8,192-token chunk beside
  ~254 decodes, 194 ms (benches/RESULTS.md), every stream's token stalled that long.
  Why 50 ms: mini-sglang's p99 ITL on the same online workload is 41-69 ms; a smaller
  budget adds steps, each re-reading every running request's KV (~9 ms beside 256 decodes
  of ~1k tokens on the 8B), which is prefill throughput lost at saturation. The curve
  (scripts/gpu-budget) measures the trade.
- `mixed_chunk_size`, offline (`LLM`): the chunk. Nobody watches a stream, and every
  extra step re-reads the KV, so a batch job wants the fewest, largest steps.
- `policy` and `mixed_step_tokens`, offline, when the weights are read at least
  WEIGHT_BOUND_S a step (the decode GEMMs are bandwidth-bound, not launch-bound): lof and
  steps of the GPU's ridge point (FLOP/s over bytes/s: the GEMM rows at which reading bf16
  weights stops being the bottleneck), rounded to a power of two within [64, 256] (256:
  the mixed-step CUDA graphs' size). H200: 206 -> 256. On the H200 offline workload that
  saves 5-6% on Llama-3.1-8B (weights read in ~3 ms) and nothing on Qwen3-0.6B (~0.25 ms,
  under a decode step's ~1.75 ms of launches), which keeps fcfs and no cap.
- `policy`, serving: spf. When requests queue (a burst, or arrivals above what the GPU
  prefills), a request's time to first token is the prefill of the prompts ahead of it; the
  shortest first is the order that makes that wait least on average (shortest job first),
  and at the median of a burst it is the prefill of the shorter half of the prompts, not of
  half of them all. Without a queue, the order changes nothing. lof would let long
  requests overtake short ones that arrived first; the cap stays off, as it holds a long
  prompt to 32-192 tokens a step beside many decodes.
- On CPU (no peak to derive from): the chunk beside decodes, fcfs, no cap; spf, if asked
  for, estimates a prompt token's compute at CPU_FLOPS.

What the others do: vLLM's `max_num_batched_tokens` is one budget per step, decodes first
and prompt chunks filling the rest (8,192 for its server and 16,384 for its `LLM` class on
GPUs of 70 GiB and more, 2,048 / 8,192 below; 2,048 was its earlier chunked-prefill
default, chosen for inter-token latency). SGLang's `chunked_prefill_size` (8,192 on
H100/H200-class memory) splits prompts, and `--enable-mixed-chunk` puts a chunk beside the
decodes; without it prefill and decode steps alternate, each decode waiting out a whole
chunk. Both leave the stall at a whole chunk by default; here the budget beside decodes
follows the latency target instead, and a step without decodes still takes the chunk."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..core import Req

if TYPE_CHECKING:
    import torch

    from ..models import ModelConfig
    from .cache import CacheManager

POLICIES = ("fcfs", "lof", "spf")
SPF_WINDOW = 32  # spf: prompts of N tokens yield to shorter ones arriving 32 prefills of N later
CPU_FLOPS = 1e11  # an order of magnitude for a few cores; only spf's window uses it
TARGET_ITL_S = 0.050
# A prompt step's linear-layer FLOPs over its time, as a fraction of the data-sheet peak:
# 8,192 tokens of Llama-3.1-8B beside ~254 decodes took 193.9 ms on an H200 (0.60 x 989
# TFLOP/s); attention, norms and the decodes' KV reads are the rest.
PREFILL_EFFICIENCY = 0.60
ROUND = 256  # prompt budgets in whole 256-token tiles
WEIGHT_BOUND_S = 0.002

# Dense bf16 tensor-core FLOP/s and HBM bytes/s from the vendors' data sheets, by a fragment
# of the device name (longest fragment first: "H20" is not an "H200").
GPU_PEAKS = {
    "H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "H20": (148e12, 4.0e12),
    "A100": (312e12, 2.0e12), "L40S": (362e12, 0.864e12), "B200": (2250e12, 8.0e12),
}
SM_FLOPS_FALLBACK = 2.89e12  # an unknown GPU: an A100's FLOP/s per SM ...
RIDGE_FALLBACK = 156  # ... and its FLOP per byte


class GpuPeak(NamedTuple):
    name: str
    flops: float  # dense bf16, per second
    bandwidth: float  # HBM, bytes per second

    @classmethod
    def of(cls, device: torch.device) -> GpuPeak | None:
        """The GPU's peak from GPU_PEAKS, or estimated from its SMs; None on CPU."""
        if device.type != "cuda":
            return None
        import torch

        props = torch.cuda.get_device_properties(device)
        for fragment in sorted(GPU_PEAKS, key=len, reverse=True):
            if fragment in props.name:
                return cls(props.name, *GPU_PEAKS[fragment])
        flops = props.multi_processor_count * SM_FLOPS_FALLBACK
        return cls(f"{props.name} (estimated)", flops, flops / RIDGE_FALLBACK)


def linear_params(cfg: ModelConfig) -> int:
    """The weights one prompt token multiplies: every layer's qkv, o and MLP linears."""
    qkv = cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    o = cfg.num_heads * cfg.head_dim * cfg.hidden_size
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_layers * (qkv + o + mlp)


def weight_bytes(cfg: ModelConfig, itemsize: int = 2) -> int:
    """The bytes a decode step reads of weights: the linears and the LM head."""
    return (linear_params(cfg) + cfg.vocab_size * cfg.hidden_size) * itemsize


class Defaults(NamedTuple):
    policy: str
    mixed_chunk_size: int
    mixed_step_tokens: int  # 0: off
    why: str  # for the start-up log line
    prompt_token_s: float  # a prompt token's estimated compute, seconds (spf's window)


def derive(cfg: ModelConfig, gpu: GpuPeak | None, chunk_size: int, offline: bool) -> Defaults:
    """The step budget's defaults for this model on this GPU (the module docstring)."""
    flops = 2 * linear_params(cfg)
    if gpu is None:
        return Defaults("fcfs", chunk_size, 0, "no GPU peak (CPU): the whole chunk",
                        flops / CPU_FLOPS)
    token_s = flops / (gpu.flops * PREFILL_EFFICIENCY)
    fits = int(TARGET_ITL_S / token_s)
    bounded = min(max(fits // ROUND * ROUND, ROUND), chunk_size)
    mixed = chunk_size if offline else bounded
    read_s = weight_bytes(cfg) / gpu.bandwidth
    why = (f"{gpu.name}: {gpu.flops / 1e12:.0f} TFLOP/s, {gpu.bandwidth / 1e12:.2f} TB/s; "
           f"{flops / 1e9:.2f} GFLOP a prompt token, weights read in {read_s * 1e3:.2f} ms")
    if not offline:
        why += (f"; serving: {fits} prompt tokens fit {TARGET_ITL_S * 1e3:.0f} ms, "
                f"{bounded} beside decodes; spf")
        return Defaults("spf", mixed, 0, why, token_s)
    if read_s < WEIGHT_BOUND_S:
        why += "; offline, launch-bound decode: fcfs, no cap"
        return Defaults("fcfs", mixed, 0, why, token_s)
    ridge = gpu.flops / gpu.bandwidth
    steps = min(max(1 << round(math.log2(ridge)), 64), 256)
    why += f"; offline, weight-bound decode: lof, steps of {steps} (ridge {ridge:.0f})"
    return Defaults("lof", mixed, steps, why, token_s)


@dataclass
class StepBudget:
    chunk_size: int
    policy: str = "fcfs"
    mixed_chunk_size: int = 0  # 0: the chunk size
    mixed_step_tokens: int = 0  # 0: off
    prompt_token_s: float = 0.0  # spf: a prompt token's estimated compute, seconds

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        if self.mixed_step_tokens and self.mixed_step_tokens < 4:
            raise ValueError(
                f"mixed_step_tokens must be 0 (off) or at least 4; got {self.mixed_step_tokens}")
        assert self.chunk_size >= 1 and self.mixed_chunk_size >= 0
        assert self.policy != "spf" or self.prompt_token_s > 0, "spf needs prompt_token_s"
        self.mixed_chunk_size = min(self.mixed_chunk_size or self.chunk_size, self.chunk_size)

    @classmethod
    def resolve(cls, chunk_size: int, policy: str | None, mixed_chunk_size: int | None,
                mixed_step_tokens: int | None, derived: Defaults) -> StepBudget:
        """Each setting given (not None) overrides its derived default."""
        return cls(chunk_size, derived.policy if policy is None else policy,
                   derived.mixed_chunk_size if mixed_chunk_size is None else mixed_chunk_size,
                   derived.mixed_step_tokens if mixed_step_tokens is None else mixed_step_tokens,
                   derived.prompt_token_s)

    @property
    def capped_from(self) -> int:
        """How many decodes a step needs for `mixed_step_tokens` to cap it (when set)."""
        return self.mixed_step_tokens // 4

    def describe(self) -> str:
        """For the scheduler's start-up log line."""
        steps = self.mixed_step_tokens
        capped = f", steps of {steps} from {self.capped_from} decodes" if steps else ""
        beside = f"{self.mixed_chunk_size} beside decodes{capped}"
        return f"chunk {self.chunk_size} ({beside}), {self.policy}"

    def enqueue(self, waiting: deque[Req], req: Req, cache: CacheManager | None = None) -> None:
        """Into the waiting queue at the policy's place; spf counts the prompt tokens
        `cache` does not hold."""
        i = len(waiting)
        if self.policy == "lof":  # after every waiting request with as long a max output
            n = req.sampling.max_new_tokens
            while i and waiting[i - 1].sampling.max_new_tokens < n:
                i -= 1
        elif self.policy == "spf":  # after every waiting request with as small a key
            cached = 0
            if cache is not None:
                cached = len(cache.prefix_cache.match_prefix(req.input_ids[:-1]).pages)
                cached *= cache.page_size
            uncached = len(req.input_ids) - cached
            req.queue_key = req.arrival + SPF_WINDOW * self.prompt_token_s * uncached
            while i and waiting[i - 1].queue_key > req.queue_key:
                i -= 1
        waiting.insert(i, req)

    def prompt_tokens(self, num_decodes: int) -> int:
        """Prompt tokens a step may take beside `num_decodes` decodes (at least 1)."""
        budget = self.chunk_size - num_decodes
        if num_decodes:
            budget = min(budget, self.mixed_chunk_size)
            cap = self.mixed_step_tokens
            if cap and num_decodes >= self.capped_from:
                budget = min(budget, max(cap - num_decodes, cap // 8))
        return max(budget, 1)
