"""The GEMM choice is timed once and kept on disk (layers/gemm_choice.py): a second start
with the same key reads it and times nothing. The timing is replaced by a recorder (the
CUTLASS kernels are CUDA-only; tests/gpu/test_gemm_sm90.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from minisgl_worker.layers import gemm, gemm_choice, gemv

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
    return gemm_choice.choose(FakeModule(), None, SHAPES, SIZES, torch.float32, torch.device("cpu"),
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


class RecordingModule:
    """A fake kernel module that computes on CPU what the named kernel would, and records
    that it ran (CUTLASS's or gemv's configurations)."""

    def __init__(self, names: dict[str, object], ran: list[str]) -> None:
        self.names, self.ran = names, ran

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name not in self.names:
            raise AttributeError(name)

        def run(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
            assert pdl
            self.ran.append(name)
            y = F.linear(x, w)
            out.copy_(_silu_and_mul(y) if name in gemv.SILU else y)

        return run


def _silu_and_mul(y: torch.Tensor) -> torch.Tensor:
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


class CostRecorder:
    """Times a call as the sum of what its kernels cost: cuBLAS when it ran no kernel of
    ours, plus `silu` when it called silu_and_mul."""

    def __init__(self, costs: dict[str, float], ran: list[str]) -> None:
        self.costs, self.ran = costs, ran

    def silu_and_mul(self, y: torch.Tensor) -> torch.Tensor:
        self.ran.append("silu")
        return _silu_and_mul(y)

    def __call__(self, fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> float:
        self.ran.clear()
        fn(weights[0])
        ours = [name for name in self.ran if name != "silu"]
        return sum(self.costs[name] for name in self.ran) + (0 if ours else self.costs["cublas"])


GATE_UP = (64, 32)  # (N = 2 * intermediate, K)


def _choose_ours(cache: Path, costs: dict[str, float], ran: list[str]) -> gemm.Sm90Gemm:
    time_us = CostRecorder(costs, ran)
    return gemm_choice.choose(RecordingModule(gemm.CONFIGS, ran), RecordingModule(gemv.CONFIGS, ran),
                              {GATE_UP: 2}, [1, 8, 16, 32], torch.float32, torch.device("cpu"),
                              cache, KEY, l2_bytes=1 << 12, gate_up=GATE_UP,
                              silu_and_mul=time_us.silu_and_mul, time_us=time_us)


def test_gemv_is_timed_past_the_launch_bound_and_cutlass_is_not(tmp_path: Path) -> None:
    fast, fused = gemv.PLAIN[-1], gemv.SILU[-1]
    costs = {"cublas": 2 * gemm.LAUNCH_BOUND_US, "silu": 5.0,
             **{c: 1.0 for c in gemm.CONFIGS},  # would win, were it timed
             **{c: 1.5 * gemm.LAUNCH_BOUND_US for c in gemv.CONFIGS}, fast: 12.0, fused: 10.0}
    ran: list[str] = []
    chosen = _choose_ours(tmp_path, costs, ran)
    assert [chosen.choice(*GATE_UP, m) for m in (1, 8, 16, 32)] == [fast, fast, fast, None]
    # gate_up 12 us + SiLU 5 us unfused, against 10 us fused; none fused past 16 rows
    assert [chosen.silu_table[GATE_UP][1]] == [[fused, fused, fused]]
    x, w = torch.randn(5, 32), torch.randn(*GATE_UP)
    ran.clear()
    fused_out = chosen.silu(x, w)
    assert ran == [fused] and fused_out is not None
    torch.testing.assert_close(fused_out, _silu_and_mul(F.linear(x, w)))
    assert chosen.silu(torch.randn(17, 32), w) is None  # past 16 rows: the GEMM, then SiLU

    def no_timing(fn: object, weights: object) -> float:
        raise AssertionError("timed again")

    again = gemm_choice.choose(RecordingModule(gemm.CONFIGS, ran), RecordingModule(gemv.CONFIGS, ran),
                               {GATE_UP: 2}, [1, 8, 16, 32], torch.float32, torch.device("cpu"),
                               tmp_path, KEY, l2_bytes=1 << 12, gate_up=GATE_UP,
                               silu_and_mul=_silu_and_mul, time_us=no_timing)
    assert again.table == chosen.table and again.silu_table == chosen.silu_table


def test_silu_stays_unfused_where_the_fused_kernel_is_slower(tmp_path: Path) -> None:
    fast = gemv.PLAIN[0]
    costs = {"cublas": 30.0, "silu": 2.0, **{c: 1.0 for c in gemm.CONFIGS},
             **{c: 25.0 for c in gemv.CONFIGS}, fast: 12.0}  # fused 25 > unfused 12 + 2
    chosen = _choose_ours(tmp_path, costs, [])
    assert chosen.silu_table[GATE_UP][1] == [None, None, None]
    assert chosen.silu(torch.randn(4, 32), torch.randn(*GATE_UP)) is None


@pytest.mark.parametrize(("m", "n", "k", "fits"), [
    (1, 64, 32, True), (16, 64, 32, True), (17, 64, 32, False), (0, 64, 32, False),
    (8, 64, 48, False),  # K not a multiple of a step's 32
    (8, 48, 32, True),  # 3 tiles of 16 rows
])
def test_gemv_fits_only_batches_and_shapes_it_tiles(m: int, n: int, k: int, fits: bool) -> None:
    one_tile = "gemv_w8_u4_r1"
    assert gemv.fits(one_tile, m, n, k) is fits
    assert not gemv.fits("gemv_w8_u4_r2", 8, 48, 32)  # 48 rows are not tiles of 32
    assert gemv.fits("gemv_silu_w8_u4_r2", 8, 32, 32)  # gate 16 + up 16 rows
    assert not gemv.fits("gemv_silu_w8_u4_r2", 8, 48, 32)  # 24-row halves
