"""The shared vocabulary of the worker: requests, batches, and the route a batch takes
through the engine.

A request's tokens are `input_ids + output_ids`. `cached_len` of them have their KV in the
pool; a batch extends each of its requests by `extend_len` tokens (a prefill chunk, or the
one newest token for a decode), after which `cached_len == device_len`. A request samples a
token only when its extend reaches the end of its tokens (the last chunk of a prefill, or
any decode step): `Req.can_sample`.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

import torch

from .protocol import SamplingParams

if TYPE_CHECKING:
    from .constrain import RequestMatcher

__all__ = ["PENDING_TOKEN", "Attn", "Batch", "Req", "ReqStatus", "Route", "RouteKind",
           "SamplingParams", "first_pending"]

# Stands in `Req.output_ids` for a token sampled by a batch still in flight (overlap
# scheduling); the scheduler replaces it when it processes that batch's results.
PENDING_TOKEN = -1


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued, no slot and no KV
    RUNNING = "running"  # holds a table slot and pages (prefilling or decoding)
    FINISHED = "finished"
    ABORTED = "aborted"


class Req:
    def __init__(self, rid: int, input_ids: list[int], sampling: SamplingParams) -> None:
        assert len(input_ids) > 0, "a request needs at least one prompt token"
        self.rid = rid
        self.input_ids = list(input_ids)
        self.sampling = sampling
        self.output_ids: list[int] = []
        self.status = ReqStatus.WAITING
        self.table_idx = -1  # row of the page table while RUNNING
        self.cached_len = 0  # tokens whose KV is in the pool
        self.device_len = 0  # cached_len + extend_len of the batch in flight
        self.prefix_len = 0  # prompt tokens that came from the prefix cache
        self.arrival = time.monotonic()  # when this worker got it (spf orders by it)
        self.queue_key = 0.0  # its place in the waiting queue under spf (budget.py)
        self.generator: torch.Generator | None = None  # per-request RNG when seeded
        # Its grammar position when sampling.constraint is set (the scheduler makes it).
        self.matcher: RequestMatcher | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without building all_ids (a decode reads one token)."""
        n = len(self.input_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.input_ids[start:end] + self.output_ids[: max(0, end - n)]

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        """Tokens still without KV (the whole prompt at first, then 1 per decode step)."""
        return self.total_len - self.cached_len

    @property
    def can_sample(self) -> bool:
        return self.device_len == self.total_len

    @property
    def is_decoding(self) -> bool:
        return len(self.output_ids) > 0

    def __repr__(self) -> str:
        return (
            f"Req(rid={self.rid}, status={self.status.value}, prompt={len(self.input_ids)}, "
            f"out={len(self.output_ids)}, cached={self.cached_len}, slot={self.table_idx})"
        )


Phase = Literal["prefill", "decode", "mixed"]


@dataclass
class Batch:
    """One forward pass. Tensors live on the engine's device; built by the scheduler."""

    reqs: list[Req]
    input_ids: torch.Tensor  # (T,) int64, every request's extend tokens back to back
    positions: torch.Tensor  # (T,) int64
    out_loc: torch.Tensor  # (T,) int64, KV pool slot for each token
    extend_lens: list[int]  # per request, sums to T
    sample_reqs: list[Req] = field(default_factory=list)  # reqs with can_sample, in order
    # Input tokens still on the device (PENDING_TOKEN on the host): input_ids[pool_index]
    # are read from the engine's token pool at the rows pool_slots before the forward.
    pool_index: torch.Tensor | None = None  # (P,) int64
    pool_slots: torch.Tensor | None = None  # (P,) int64, request slots (table rows)
    # sample_reqs' table rows, where their sampled tokens go in the token pool (None: the
    # engine copies them over itself)
    sample_rows: torch.Tensor | None = None  # (S,) int64
    # Each request's table row and KV length as the batch was built: what its launch
    # plans attention with. (Under overlap a step of grammar rows processes the previous
    # batch, and an abort may come, before it launches a batch planned ahead: either may
    # end some of these requests first.)
    table_rows: list[int] = field(init=False)
    kv_lens: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.table_rows = [r.table_idx for r in self.reqs]
        self.kv_lens = [r.device_len for r in self.reqs]

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def phase(self) -> Phase:
        decodes = sum(1 for r in self.reqs if r.is_decoding and r.extend_len == 1)
        if decodes == len(self.reqs):
            return "decode"
        return "prefill" if decodes == 0 else "mixed"

    @property
    def last_token_indices(self) -> list[int]:
        """Index in the flat token dim of each sampling request's last token."""
        out, end = [], 0
        for req, n in zip(self.reqs, self.extend_lens):
            end += n
            if req.can_sample:
                out.append(end - 1)
        return out


class RouteKind(enum.Enum):
    """How the engine runs a batch's forward (engine/route.py picks it)."""

    DECODE_GRAPH = "decode graph"  # one CUDA graph of the whole forward, per padded size
    MIXED_GRAPH = "mixed graph"  # the same, for small steps with prompt tokens
    PIECEWISE = "piecewise"  # CUDA graphs between the layers' attention calls
    EAGER = "eager"  # no graph


class Attn(enum.Enum):
    """Which attention kernels a batch runs (how the backend plans it)."""

    TORCH = "torch"  # torch-native (any batch)
    DECODE = "decode"  # every request extends by one token: the decode kernel
    PREFILL = "prefill"  # prompt chunks only: the prefill kernel (FA3 on SM90)
    MIXED_FA2 = "mixed fa2"  # decodes and chunks in one launch of FA2's prefill kernel
    DECODE_THEN_PREFILL = "decode + prefill"  # leading decodes, then chunks: two kernels
    SPLIT_KV = "split kv"  # decode graph: FlashInfer's split-KV decode
    WHOLE_KV = "whole kv"  # decode graph: each request's KV in one piece (triton_decode.py)


class Route(NamedTuple):
    kind: RouteKind
    attn: Attn
    size: int = 0  # the graph's rows (padded batch size or token bucket); 0 when eager


def first_pending(output_ids: list[int]) -> int:
    """Index of the oldest PENDING_TOKEN: they are the last one or two entries (searching
    from the front made processing quadratic in the output length)."""
    i = len(output_ids) - 1
    assert output_ids[i] == PENDING_TOKEN
    while i > 0 and output_ids[i - 1] == PENDING_TOKEN:
        i -= 1
    return i
