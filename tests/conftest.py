"""Shared test set-up: GPU tests are skipped where there is no CUDA device, and every worker
the tests start checks the scheduler's invariants after each step."""

import os
from collections.abc import Iterator

import pytest

# Inherited by the workers the end-to-end tests' routers spawn (scheduler/loop.py).
os.environ["MINISGL_CHECK_INVARIANTS"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _engine_context_is_released() -> Iterator[None]:
    """An in-process Engine owns the one global context; a test that leaves it set would fail
    every later test that builds an engine. Fail the culprit instead, and clean up after it."""
    yield
    from minisgl_worker import context

    leaked = context._GLOBAL_CTX is not None
    context.clear_global_ctx()
    assert not leaked, "this test left an Engine running: call LLM.shutdown() / Engine.shutdown()"
