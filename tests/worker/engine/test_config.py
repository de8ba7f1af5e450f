"""The piecewise-graph setting, where it is validated: EngineConfig and the worker CLI."""

from __future__ import annotations

import pytest
import torch
from minisgl_worker.__main__ import parse_args
from minisgl_worker.engine import EngineConfig
from minisgl_worker.engine.piecewise import piece_sizes


@pytest.mark.parametrize("bad", [-2, 1, 15])
def test_cuda_graph_max_tokens_out_of_range_names_the_field(bad: int) -> None:
    with pytest.raises(AssertionError, match=f"cuda_graph_max_tokens must be -1, 0 or >= 16; "
                                             f"got {bad}"):
        EngineConfig("m", cuda_graph_max_tokens=bad)


def test_cuda_graph_max_tokens_resolves_per_device() -> None:
    assert EngineConfig("m").resolve_graph_max_tokens(torch.device("cuda")) == 512
    assert EngineConfig("m", cuda_graph_max_tokens=64).resolve_graph_max_tokens(
        torch.device("cuda")) == 64
    assert EngineConfig("m", cuda_graph_max_tokens=0).resolve_graph_max_tokens(
        torch.device("cuda")) == 0
    assert EngineConfig("m").resolve_graph_max_tokens(torch.device("cpu")) == 0


def test_worker_cli_takes_and_checks_cuda_graph_max_tokens(capsys: pytest.CaptureFixture) -> None:
    base = ["--model", "m", "--listen", "ipc:///tmp/x"]
    assert parse_args(base).cuda_graph_max_tokens == -1
    assert parse_args([*base, "--cuda-graph-max-tokens", "256"]).cuda_graph_max_tokens == 256
    with pytest.raises(SystemExit):
        parse_args([*base, "--cuda-graph-max-tokens", "8"])
    assert "must be -1, 0 or >= 16; got 8" in capsys.readouterr().err


def test_piece_sizes_step_by_16_up_to_the_limit() -> None:
    assert piece_sizes(64) == [16, 32, 48, 64]
    assert piece_sizes(70) == [16, 32, 48, 64]  # a batch of 65..70 tokens runs eagerly
