"""The forward context: what a layer reaches during a forward that is not a tensor argument
(the attention backend, and the batch being run). One per engine, set while it lives."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .attention.base import BaseAttnBackend
    from .core import Batch


class Context:
    def __init__(self, attn_backend: BaseAttnBackend) -> None:
        self.attn_backend = attn_backend
        self._batch: Batch | None = None

    @property
    def batch(self) -> Batch:
        assert self._batch is not None, "no batch is being forwarded"
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        assert self._batch is None, "forward_batch is not reentrant"
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context) -> None:
    """Set once per engine; `clear_global_ctx` when the engine shuts down."""
    global _GLOBAL_CTX
    assert _GLOBAL_CTX is None, "global context already set: shut the other Engine down first"
    _GLOBAL_CTX = ctx


def clear_global_ctx() -> None:
    global _GLOBAL_CTX
    _GLOBAL_CTX = None


def get_global_ctx() -> Context:
    assert _GLOBAL_CTX is not None, "global context not set: build an Engine first"
    return _GLOBAL_CTX
