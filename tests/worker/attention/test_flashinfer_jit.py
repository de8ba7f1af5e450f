"""`build_jit_optional`: an optional JIT module (the CUTLASS GEMMs) that fails to compile
leaves the engine's required modules built and is reported, never fatal; a failure in the
required ones still raises. The ninja build is replaced by a recorder (runs on CPU)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from minisgl_worker.attention import flashinfer_jit

NORM, DECODE, GEMM = (SimpleNamespace(name=n) for n in ("norm", "decode", "gemm"))


def _recorder(monkeypatch: pytest.MonkeyPatch, fails: set[str]) -> list[list[str]]:
    """Each build's module names; a build including any of `fails` raises as ninja's does."""
    runs: list[list[str]] = []

    def build(specs: list[SimpleNamespace]) -> None:
        runs.append([s.name for s in specs])
        if fails & set(runs[-1]):
            raise RuntimeError("Ninja build failed")

    monkeypatch.setattr(flashinfer_jit, "build_jit", build)
    return runs


def test_optional_modules_build_in_the_same_run(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _recorder(monkeypatch, fails=set())
    assert flashinfer_jit.build_jit_optional([NORM, DECODE], [GEMM]) is True
    assert runs == [["norm", "decode", "gemm"]]


def test_a_failing_optional_module_falls_back_to_the_required_ones(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs = _recorder(monkeypatch, fails={"gemm"})
    with caplog.at_level(logging.WARNING):
        assert flashinfer_jit.build_jit_optional([NORM, DECODE], [GEMM]) is False
    assert runs == [["norm", "decode", "gemm"], ["norm", "decode"]]
    assert "could not build gemm" in caplog.text


def test_a_failing_required_module_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _recorder(monkeypatch, fails={"decode"})
    with pytest.raises(RuntimeError, match="Ninja build failed"):
        flashinfer_jit.build_jit_optional([NORM, DECODE], [GEMM])
    assert runs == [["norm", "decode", "gemm"], ["norm", "decode"]]


def test_without_optional_modules_one_plain_build(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _recorder(monkeypatch, fails=set())
    assert flashinfer_jit.build_jit_optional([NORM], []) is False
    assert runs == [["norm"]]
