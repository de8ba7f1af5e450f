"""The attention plug point. A backend is built once per engine. Per batch the engine calls
`prepare(batch, route)` before the forward (it plans the kernels `route.attn` names, for the
graph `route` replays, if any), and every attention layer calls `forward(q, k, v, layer_id,
rope)`, which writes k/v into the KV pool at `batch.out_loc` and attends each request's
queries over its cached tokens (prefix + this extend).

A backend that CUDA graphs can hold (`GraphAttnBackend`) also owns its part of their life:
`init_capture_graph` builds the fixed buffers the graphs read, `prepare_for_capture` plans
a graph's attention before it is captured (and, for piecewise graphs, takes the
`GraphBreak` at which the capture stops before each attention call), and `attend` runs one
layer's attention between the pieces of a piecewise replay."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Protocol

import torch

from ..core import Batch, Route
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding


class Rope(NamedTuple):
    """What a backend does to q and k before it stores k: each head RMS-normalized first
    when `qk_norm` is given (Qwen3's q_norm and k_norm), then rotated by `positions`."""

    rotary: RotaryEmbedding
    positions: torch.Tensor  # (T,)
    qk_norm: tuple[RMSNorm, RMSNorm] | None = None


class GraphBreak(Protocol):
    """Where a piecewise capture hands attention over to the replay (engine/graphs)."""

    def q_out(self, tokens: int) -> torch.Tensor:
        """The static buffer the layer's rotated q goes to (the replay's attention reads it)."""

    def cut(self, layer_id: int, tokens: int) -> torch.Tensor:
        """End the piece that ran up to layer `layer_id`'s KV store, start the next -> the
        static attention output that piece reads (filled between the pieces at replay)."""


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare(self, batch: Batch, route: Route) -> None:
        """Plan the batch's attention for `route` (it reads the page-table rows of the
        batch's requests, so call it after their new tokens' slots are written)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) of the batch's new tokens -> (T, Hq, D); with
        `rope`, q and k are (normalized and) rotated first."""


class GraphAttnBackend(BaseAttnBackend):
    @abstractmethod
    def init_capture_graph(self, decode_sizes: list[int], whole_kv_sizes: list[int],
                           mixed_sizes: list[int], max_pages_per_req: int) -> None:
        """Build the fixed buffers and plans of the graphs the engine will capture: decode
        graphs at `decode_sizes` (the whole-KV variant too at `whole_kv_sizes`) and mixed
        graphs at `mixed_sizes` rows; a request references at most `max_pages_per_req`."""

    @abstractmethod
    def prepare_for_capture(self, batch: Batch, route: Route,
                            graph_break: GraphBreak | None = None) -> None:
        """Plan the request-less `batch` a graph of `route` is captured with. With
        `graph_break` (piecewise graphs), `forward` stores k/v and cuts there instead of
        attending, until the next `prepare` or `prepare_for_capture`."""

    @abstractmethod
    def attend(self, layer_id: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Layer `layer_id`'s attention of the prepared batch, q (T, Hq, D) (k/v already
        stored) into `out` (a piecewise replay runs it between the pieces)."""
