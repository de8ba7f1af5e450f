"""The CUDA-graph settings, where they are validated: EngineConfig and the worker CLI."""

from __future__ import annotations

import pytest
from minisgl_worker.__main__ import parse_args
from minisgl_worker.engine import EngineConfig
from minisgl_worker.engine.route import bucket_for, piece_sizes


@pytest.mark.parametrize(("field", "allowed", "bad"), [
    *[("cuda_graph_max_tokens", "-1, 0 or >= 16", bad) for bad in (-2, 1, 15)],
    *[("cuda_graph_mixed_tokens", "0 or >= 16", bad) for bad in (-1, 1, 15)],
])
def test_graph_token_limits_out_of_range_name_the_field(field: str, allowed: str,
                                                        bad: int) -> None:
    with pytest.raises(AssertionError, match=f"{field} must be {allowed}; got {bad}"):
        EngineConfig("m", **{field: bad})


def test_cuda_graph_max_tokens_resolves_on_a_gpu() -> None:
    assert EngineConfig("m").resolve_graph_max_tokens() == 512
    assert EngineConfig("m", cuda_graph_max_tokens=64).resolve_graph_max_tokens() == 64
    assert EngineConfig("m", cuda_graph_max_tokens=0).resolve_graph_max_tokens() == 0


def test_cuda_graph_max_bs_resolves_by_gpu_memory() -> None:
    assert EngineConfig("m").resolve_graph_max_bs(141 << 30, 256) == 256
    assert EngineConfig("m").resolve_graph_max_bs(40 << 30, 256) == 128
    assert EngineConfig("m").resolve_graph_max_bs(141 << 30, 64) == 64
    assert EngineConfig("m", cuda_graph_max_bs=0).resolve_graph_max_bs(141 << 30, 256) == 0


def test_cuda_graph_mixed_tokens_resolves_under_the_piecewise_limit() -> None:
    assert EngineConfig("m").resolve_graph_mixed_tokens(512) == 256
    assert EngineConfig("m", cuda_graph_mixed_tokens=0).resolve_graph_mixed_tokens(512) == 0
    assert EngineConfig("m", cuda_graph_mixed_tokens=256).resolve_graph_mixed_tokens(64) == 64
    assert EngineConfig("m", cuda_graph_mixed_tokens=48).resolve_graph_mixed_tokens(0) == 0


def test_worker_cli_takes_and_checks_cuda_graph_max_tokens(capsys: pytest.CaptureFixture) -> None:
    base = ["--model", "m", "--listen", "ipc:///tmp/x"]
    assert parse_args(base).cuda_graph_max_tokens == -1
    assert parse_args([*base, "--cuda-graph-max-tokens", "256"]).cuda_graph_max_tokens == 256
    with pytest.raises(SystemExit):
        parse_args([*base, "--cuda-graph-max-tokens", "8"])
    assert "must be -1, 0 or >= 16; got 8" in capsys.readouterr().err


def test_worker_cli_checks_cuda_graph_max_bs(capsys: pytest.CaptureFixture) -> None:
    base = ["--model", "m", "--listen", "ipc:///tmp/x"]
    assert parse_args(base).cuda_graph_max_bs == -1
    assert parse_args([*base, "--cuda-graph-max-bs", "0"]).cuda_graph_max_bs == 0
    assert parse_args([*base, "--cuda-graph-max-bs", "64"]).cuda_graph_max_bs == 64
    with pytest.raises(SystemExit):
        parse_args([*base, "--cuda-graph-max-bs", "-2"])
    assert "--cuda-graph-max-bs: must be -1 (auto), 0 (none) or >= 1; got -2" in (
        capsys.readouterr().err)


def test_piece_sizes_step_by_16_up_to_the_limit() -> None:
    assert piece_sizes(64) == [16, 32, 48, 64]
    assert piece_sizes(70) == [16, 32, 48, 64]  # a batch of 65..70 tokens runs eagerly


def test_piece_sizes_add_the_chunk_size_above_the_limit() -> None:
    assert piece_sizes(64, 8192) == [16, 32, 48, 64, 8192]
    assert piece_sizes(64, 64) == [16, 32, 48, 64]  # already a bucket
    assert piece_sizes(64, 40) == [16, 32, 48, 64]  # below the limit: the 48 bucket serves
    assert piece_sizes(8, 8192) == []  # no buckets at all stays none


def test_bucket_for_pads_fewer_than_16_rows() -> None:
    sizes = piece_sizes(64, 8192)
    assert bucket_for(sizes, 1) == 16
    assert bucket_for(sizes, 33) == 48
    assert bucket_for(sizes, 64) == 64
    assert bucket_for(sizes, 65) is None  # 8127 padding rows: eager
    assert bucket_for(sizes, 8176) is None  # 16 padding rows: eager
    assert bucket_for(sizes, 8177) == 8192
    assert bucket_for(sizes, 8192) == 8192
    assert bucket_for(sizes, 8193) is None


def test_worker_cli_checks_mixed_step_tokens(capsys: pytest.CaptureFixture) -> None:
    base = ["--model", "m", "--listen", "ipc:///tmp/x"]
    args = parse_args(base)  # derived (scheduler/budget.py) unless given
    assert (args.mixed_step_tokens, args.mixed_chunk_size, args.schedule_policy) == (
        -1, -1, "auto")
    assert parse_args([*base, "--mixed-step-tokens", "0"]).mixed_step_tokens == 0
    assert parse_args([*base, "--mixed-step-tokens", "256"]).mixed_step_tokens == 256
    with pytest.raises(SystemExit):
        parse_args([*base, "--mixed-step-tokens", "3"])
    assert "--mixed-step-tokens: must be -1 (derived), 0 (off) or >= 4; got 3" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        parse_args([*base, "--mixed-chunk-size", "-2"])
    assert "must be -1 (derived) or >= 0; got -2" in capsys.readouterr().err
