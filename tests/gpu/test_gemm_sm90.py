"""The CUTLASS GEMMs of layers/gemm.py (Hopper, bf16) against F.linear: every configuration
at batch sizes on and off its tiles, launched with PDL inside a CUDA graph, and the tuned
chooser's dispatch. Outputs are poisoned first so an unwritten element fails."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from minisgl_worker.layers import gemm

from .paged import rel_err

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or not gemm.supported(DEV, BF16),
    reason="CUTLASS SM90 GEMMs: Hopper (SM 9.0) only")


@cache
def _module() -> Any:
    return gemm.jit_spec().build_and_load()


def _weights(n: int, k: int, count: int = 1) -> list[torch.Tensor]:
    return [torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5 for _ in range(count)]


@needs_sm90
@pytest.mark.parametrize("config", sorted(gemm.CONFIGS))
@pytest.mark.parametrize("m", [1, 13, 64, 200, 256])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072), (6144, 4096)])
def test_each_configuration_matches_f_linear(config: str, m: int, n: int, k: int) -> None:
    x = torch.randn(m, k, device=DEV, dtype=BF16)
    (w,) = _weights(n, k)
    out = torch.full((m, n), float("nan"), device=DEV, dtype=BF16)
    getattr(_module(), config)(x, w, out, False)
    assert rel_err(out, F.linear(x, w)) < TOL


@needs_sm90
def test_pdl_launches_inside_a_cuda_graph_match_eager() -> None:
    """A chain of dependent GEMMs launched with PDL: each waits for the one before it."""
    ws = _weights(1024, 1024, 6)
    x = torch.randn(96, 1024, device=DEV, dtype=BF16)
    outs = [torch.empty(96, 1024, device=DEV, dtype=BF16) for _ in ws]

    def chain() -> None:
        a = x
        for w, out in zip(ws, outs, strict=True):
            _module().swap_64x32x128_ping(a, w, out, True)
            a = out

    chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    ref = x
    for w in ws:
        ref = F.linear(ref, w)
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(outs[-1], ref) < TOL


def _tune(weights: list[torch.Tensor], sizes: list[int]) -> gemm.Sm90Gemm:
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
    for w in weights:
        by_shape.setdefault((w.shape[0], w.shape[1]), []).append(w)
    return gemm.Sm90Gemm(_module(), gemm.Sm90Gemm.tune(_module(), by_shape, sizes))


@needs_sm90
def test_tuned_choice_dispatches_by_shape_and_batch() -> None:
    sizes = [8, 64, 128]
    qkv, down = _weights(4096, 1024, 4), _weights(1024, 3072, 4)
    tuned = _tune(qkv + down, sizes)
    assert set(tuned.table) == {(4096, 1024), (1024, 3072)}
    for shape, (ms, picks) in tuned.table.items():
        assert ms == sizes, shape
        assert all(p is None or p in gemm.CONFIGS for p in picks)
    for m in (1, 8, 9, 100, 128, 129, 300):  # on, between, and beyond the tuned sizes
        x = torch.randn(m, 1024, device=DEV, dtype=BF16)
        assert rel_err(tuned(x, qkv[0]), F.linear(x, qkv[0])) < TOL
        expected = tuned.table[4096, 1024][1][sizes.index(min(s for s in sizes if s >= m))] \
            if m <= sizes[-1] else None
        assert tuned.choice(4096, 1024, m) == expected
    assert tuned.choice(512, 512, 8) is None  # a shape never tuned: cuBLAS


@needs_sm90
def test_gemms_slower_than_the_launch_bound_stay_on_cublas() -> None:
    gate_up = _weights(28672, 4096, 2)  # Llama-3.1-8B's: ~60 us in cuBLAS
    tuned = _tune(gate_up, [8, 128])
    assert tuned.table[28672, 4096] == ([8, 128], [None, None])


@needs_sm90
def test_shapes_without_16_byte_rows_stay_on_cublas() -> None:
    (w,) = _weights(1000, 1020)  # K = 1020: rows of 2,040 bytes, which TMA cannot load
    tuned = _tune([w], [8])
    assert tuned.choice(1000, 1020, 8) is None
    x = torch.randn(8, 1020, device=DEV, dtype=BF16)
    assert rel_err(tuned(x, w), F.linear(x, w)) < TOL


@needs_sm90
def test_the_choice_kept_on_disk_is_the_one_timed(tmp_path: Any) -> None:
    """gemm_choice.choose on the GPU: the first start times and writes, the second reads the
    same choice without timing (its timer would fail)."""
    from minisgl_worker.layers import gemm_choice

    shapes, sizes = {(4096, 1024): 4, (1024, 3072): 4}, [8, 64]
    key = gemm_choice.cache_key(DEV, BF16, shapes, sizes)
    args = (_module(), shapes, sizes, BF16, DEV, tmp_path, key,
            torch.cuda.get_device_properties(DEV).L2_cache_size)
    first = gemm_choice.choose(*args)

    def no_timing(fn: Any, weights: Any) -> float:
        raise AssertionError("timed again")

    second = gemm_choice.choose(*args, time_us=no_timing)
    assert second.table == first.table and len(list(tmp_path.iterdir())) == 1
