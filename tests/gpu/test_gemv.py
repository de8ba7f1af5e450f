"""Our decode-batch GEMM (layers/gemv.py, Hopper, bf16) against F.linear and FlashInfer's
SiLU-and-mul: every configuration at every batch it takes, on model shapes and small ones;
rows independent of the batch they are in; PDL launches chained in a CUDA graph; and the
tuned choice's dispatch. Outputs are poisoned first so an unwritten element fails."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from minisgl_worker.layers import cuda_ops, gemm, gemv

from .paged import rel_err

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16 = torch.bfloat16
TOL = 1e-2

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or not gemm.supported(DEV, BF16),
    reason="the gemv kernels: Hopper (SM 9.0) only")

# (N, K): Llama-3.1-8B's qkv, down and gate_up, Qwen3-0.6B's o, and two that split unevenly
# over the warps (K / 32 = 18 and 3 steps)
SHAPES = [(6144, 4096), (4096, 14336), (28672, 4096), (1024, 2048), (192, 576), (64, 96)]


@cache
def _module() -> Any:
    return gemv.jit_spec().build_and_load()


def _run(config: str, x: torch.Tensor, w: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    silu = gemv.CONFIGS[config][3]
    out = torch.full((x.shape[0], w.shape[0] // 2 if silu else w.shape[0]), float("nan"),
                     device=DEV, dtype=BF16)
    getattr(_module(), config)(x, w, out, pdl)
    return out


def _weight(n: int, k: int) -> torch.Tensor:
    return torch.randn(n, k, device=DEV, dtype=BF16) / k**0.5


@needs_sm90
@pytest.mark.parametrize("config", gemv.PLAIN)
@pytest.mark.parametrize("n,k", SHAPES)
def test_each_configuration_matches_f_linear(config: str, n: int, k: int) -> None:
    w = _weight(n, k)
    for m in (1, 3, 8, 9, 16):
        if not gemv.fits(config, m, n, k):
            continue
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        out = _run(config, x, w)
        assert not out.isnan().any(), (m, "unwritten")
        assert rel_err(out, F.linear(x, w)) < TOL, m


@needs_sm90
@pytest.mark.parametrize("config", gemv.SILU)
@pytest.mark.parametrize("n,k", [(28672, 4096), (6144, 1024), (64, 96)])
def test_each_silu_configuration_matches_gemm_then_silu_and_mul(config: str, n: int,
                                                                k: int) -> None:
    w = _weight(n, k)
    for m in (1, 5, 8, 12, 16):
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        out = _run(config, x, w)
        assert not out.isnan().any(), (m, "unwritten")
        assert rel_err(out, cuda_ops.silu_and_mul(F.linear(x, w))) < TOL, m


@needs_sm90
@pytest.mark.parametrize("config", [gemv.PLAIN[0], gemv.PLAIN[-1], gemv.SILU[0]])
def test_a_row_is_the_same_in_every_batch(config: str) -> None:
    """A padded graph batch and an eager one must give a request the same logits."""
    w = _weight(4096, 4096)
    x = torch.randn(16, 4096, device=DEV, dtype=BF16)
    alone = _run(config, x[:1], w)
    for m in (2, 7, 8, 9, 16):
        torch.testing.assert_close(_run(config, x[:m], w)[:1], alone, rtol=0, atol=0)


@needs_sm90
def test_pdl_launches_inside_a_cuda_graph_match_eager() -> None:
    """Dependent GEMMs launched with PDL, with FlashInfer's in-place add-RMSNorm (also PDL)
    between them: each kernel waits for the one before it before reading its input."""
    ws = [_weight(2048, 2048) for _ in range(6)]
    x = torch.randn(8, 2048, device=DEV, dtype=BF16)
    res, norm_w = torch.randn_like(x), torch.ones(2048, device=DEV, dtype=BF16)

    def chain(gemm_fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        a, r = x.clone(), res.clone()
        for w in ws:
            a = gemm_fn(a, w)
            cuda_ops.fused_add_rmsnorm(a, r, norm_w, 1e-6)
        return a, r

    ref = chain(F.linear)
    static: list[tuple[torch.Tensor, torch.Tensor]] = []

    def run() -> None:
        static.append(chain(lambda a, w: gemv.run(_module(), "gemv_w8_u4_r1", a, w)))

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for t in static[-1]:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static[-1], ref, strict=True):
        assert rel_err(got, want) < 5 * TOL


@needs_sm90
def test_tuned_choice_dispatches_gemv_and_fused_silu() -> None:
    """Sm90Gemm.tune with the gemv module on Llama-3.1-8B's gate_up: at <= 16 rows its
    choice computes what F.linear does, past 16 rows gemv is never picked, and silu() fuses
    only where its table says so."""
    from minisgl_worker.layers.gemm import Sm90Gemm

    ws = [_weight(28672, 4096) for _ in range(2)]
    sizes = [1, 8, 16, 32]
    choices = Sm90Gemm.tune(None, _module(), {(28672, 4096): ws}, sizes)
    tuned = Sm90Gemm(None, _module(), choices)
    silu = tuned.tune_silu(ws, sizes, cuda_ops.silu_and_mul)
    tuned = Sm90Gemm(None, _module(), choices, silu)
    assert tuned.choice(28672, 4096, 32) is None  # beyond gemv; CUTLASS is not timed here
    assert set(silu[28672, 4096]) == {1, 8, 16}
    for m in (1, 5, 8, 16, 20):
        x = torch.randn(m, 4096, device=DEV, dtype=BF16)
        assert rel_err(tuned(x, ws[0]), F.linear(x, ws[0])) < TOL, m
        fused = tuned.silu(x, ws[0])
        assert (fused is not None) == (m <= 16 and silu[28672, 4096][min(
            s for s in sizes if s >= m)] is not None), m
        if fused is not None:
            assert rel_err(fused, cuda_ops.silu_and_mul(F.linear(x, ws[0]))) < TOL, m
