"""The GEMM choice is timed once and kept on disk (layers/gemm_choice.py): a second start
with the same key reads it and times nothing. The timing is replaced by a recorder (the
CUTLASS kernels are CUDA-only; tests/gpu/test_gemm_sm90.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from minisgl_worker.layers import gemm, gemm_choice

SHAPES = {(64, 32): 3, (24, 16): 2, (20, 16): 1}  # (N, K) -> layers; N=20: not 16-byte rows
SIZES = [1, 8, 64]
KEY = {"gpu": "test", "sizes": SIZES}


class Recorder:
    """Times cuBLAS at 5 us and each configuration, in call order, from 4.0 us up by 1 us:
    the first one timed at each size wins (by more than the PDL credit, it must)."""

    def __init__(self) -> None:
        self.calls = 0
        self._since_cublas = 0

    def __call__(self, fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> float:
        assert weights and all(w.shape == weights[0].shape for w in weights)
        self.calls += 1
        if self._is_cublas(fn, weights[0]):
            self._since_cublas = 0
            return 5.0
        self._since_cublas += 1
        return 3.0 + self._since_cublas

    @staticmethod
    def _is_cublas(fn: Callable[[torch.Tensor], object], w: torch.Tensor) -> bool:
        try:
            fn(w)  # F.linear runs on CPU; the fake module's configurations raise
        except _Cutlass:
            return False
        return True


class _Cutlass(Exception):
    pass


class FakeModule:
    def __getattr__(self, name: str) -> Callable[..., None]:
        assert name in gemm.CONFIGS, name

        def run(*args: object) -> None:
            raise _Cutlass(name)

        return run


def _choose(cache: Path, time_us: Recorder, key: dict[str, object] = KEY) -> gemm.Sm90Gemm:
    return gemm_choice.choose(FakeModule(), SHAPES, SIZES, torch.float32, torch.device("cpu"),
                              cache, key, l2_bytes=1 << 12, time_us=time_us)


def test_the_choice_is_written_once_and_read_on_the_next_start(tmp_path: Path) -> None:
    first = Recorder()
    chosen = _choose(tmp_path, first)
    assert first.calls > 0
    files = list(tmp_path.glob("gemm-choices-*.json"))
    assert len(files) == 1
    # The recorder's winner: the first configuration timed at each size.
    for m in SIZES:
        eligible = [c for c in gemm.CONFIGS if gemm.batch_tile(c) <= max(64, 2 * m)]
        assert chosen.choice(64, 32, m) == chosen.choice(24, 16, m) == eligible[0]
    assert all(chosen.choice(20, 16, m) is None for m in SIZES)  # cuBLAS: never timed

    second = Recorder()
    again = _choose(tmp_path, second)
    assert second.calls == 0
    assert again.table == chosen.table
    assert list(tmp_path.glob("gemm-choices-*.json")) == files


def test_another_key_times_anew(tmp_path: Path) -> None:
    _choose(tmp_path, Recorder())
    other = Recorder()
    _choose(tmp_path, other, {**KEY, "torch": "another version"})
    assert other.calls > 0 and len(list(tmp_path.glob("gemm-choices-*.json"))) == 2


def test_a_file_naming_an_unknown_kernel_is_refused(tmp_path: Path) -> None:
    _choose(tmp_path, Recorder())
    path = next(tmp_path.glob("gemm-choices-*.json"))
    name = next(iter(gemm.CONFIGS))
    path.write_text(path.read_text().replace(f'"{name}"', '"no_such_kernel"'))
    with pytest.raises(AssertionError, match="unknown configuration no_such_kernel"):
        _choose(tmp_path, Recorder())
