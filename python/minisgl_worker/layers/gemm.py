"""Decode-sized GEMMs on Hopper: cuBLAS, or a CUTLASS kernel launched with PDL where faster.

At Qwen3-0.6B's sizes a decode layer's four GEMMs take ~6 us each for ~1-3 us of bytes: most
of each is launch and set-up, and cuBLAS (F.linear) cannot launch with programmatic
dependent launch (PDL), which overlaps that with the previous kernel. CUTLASS's SM90 kernels
can (gemm_sm90.cu). Alone they are about as fast as cuBLAS at some sizes and slower at
others, so `Sm90Gemm.tune` times, for each weight shape of the model and each decode graph's
batch size, cuBLAS and every configuration alone (cycling through the model's weights of
that shape, so they stream from HBM as in a step), and keeps the fastest configuration
unless cuBLAS beats it by more than PDL_CREDIT_US; GEMMs that take cuBLAS more than
LAUNCH_BOUND_US stay on cuBLAS. Batches of other sizes up to the largest tuned one use the
choice of the next larger tuned size; larger ones use cuBLAS. Measured on the H200
(`benches/kernels/cutlass_gemm.py`): Qwen3-0.6B's layer chain without attention
4-5 us a layer faster at M <= 128, ~1 us at 256; its offline run ~3% faster. Timing can
round either way between close candidates, so the choice is made once per GPU, shapes and
library versions and kept on disk (gemm_choice.py): two starts run the same kernels.
`--gemm cublas` keeps cuBLAS everywhere."""

from __future__ import annotations

import hashlib
import logging
import time
from bisect import bisect_left
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gemm_sm90.cu")
# (swapped, tile rows, tile columns, tile K, kernel). The batch is the tile's columns when
# swapped (the weight's rows are the tile's rows), else its rows.
_TILES = [
    (True, 64, 32, 128, "Ping"), (True, 64, 64, 128, "Ping"), (True, 64, 96, 128, "Ping"),
    (True, 64, 128, 64, "Ping"), (True, 64, 192, 64, "Ping"),
    (True, 128, 32, 128, "Coop"), (True, 128, 64, 128, "Coop"), (True, 128, 128, 64, "Coop"),
    (True, 128, 256, 64, "Coop"),
    (False, 64, 64, 128, "Ping"), (False, 64, 128, 64, "Ping"), (False, 128, 128, 64, "Coop"),
]
# name (also the exported function's): e.g. swap_64x32x128_ping -> its tile
CONFIGS = {f"{'swap' if swap else 'plain'}_{rows}x{cols}x{k}_{kernel.lower()}":
           (swap, rows, cols, k, kernel) for swap, rows, cols, k, kernel in _TILES}
PDL_CREDIT_US = 1.0  # what PDL hid per GEMM in benches/kernels/cutlass_gemm.py's layer chains
# Only GEMMs that cuBLAS runs this fast are tuned; slower ones stay on cuBLAS. PDL hides a
# launch, which matters beside a few microseconds of work. On Llama-3.1-8B (12-90 us GEMMs)
# the tuned choice made the offline bench 2-5% slower (benches/RESULTS.md).
LAUNCH_BOUND_US = 10.0


def module_name() -> str:
    """Changes with the source or the configurations, so a stale build is never loaded."""
    digest = hashlib.sha256(SOURCE.read_bytes() + repr(CONFIGS).encode()).hexdigest()
    return f"minisgl_gemm_sm90_{digest[:10]}"


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cuda" and dtype == torch.bfloat16
            and torch.cuda.get_device_capability(device) == (9, 0))


def jit_spec() -> JitSpec:
    """One FlashInfer JIT module; each configuration compiles gemm_sm90.cu in its own
    translation unit (so ninja builds them in parallel) and exports one function."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit import gen_jit_spec
    from flashinfer.jit.core import sm90a_nvcc_flags
    from flashinfer.jit.utils import write_if_different

    name = module_name()
    sources = []
    for config, (swap, rows, cols, k, kernel) in CONFIGS.items():
        defines = {"CFG_NAME": config, "CFG_SWAP": int(swap), "CFG_ROWS": rows,
                   "CFG_COLS": cols, "CFG_K": k, "CFG_SCHED": kernel, "CFG_EPI": f"{kernel}Epi"}
        path = jit_env.FLASHINFER_GEN_SRC_DIR / name / f"{config}.cu"
        text = "".join(f"#define {key} {value}\n" for key, value in defines.items())
        write_if_different(path, f'{text}#include "{SOURCE}"\n')
        sources.append(path)
    flags = [*sm90a_nvcc_flags, "-DCUTLASS_ENABLE_GDC_FOR_SM90=1"]
    return gen_jit_spec(name, sources, extra_cuda_cflags=flags)


def batch_tile(config: str) -> int:
    swap, rows, cols, _, _ = CONFIGS[config]
    return cols if swap else rows


# (N, K) -> batch size -> a configuration, or None: cuBLAS
Choices = dict[tuple[int, int], dict[int, str | None]]
TimeUs = Callable[[Callable[[torch.Tensor], object], list[torch.Tensor]], float]


class Sm90Gemm:
    """`gemm(x, w)` = F.linear(x, w) for x (M, K) and w (N, K), bf16, contiguous."""

    def __init__(self, module: object, choices: Choices):
        self.module = module
        # (N, K) -> (sorted tuned Ms, the choice at each: a configuration or None = cuBLAS)
        self.table = {shape: (sorted(by_m), [by_m[m] for m in sorted(by_m)])
                      for shape, by_m in choices.items()}

    def choice(self, n: int, k: int, m: int) -> str | None:
        ms, picks = self.table.get((n, k), ((), ()))
        i = bisect_left(ms, m)
        return picks[i] if i < len(ms) else None

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        config = self.choice(w.shape[0], w.shape[1], x.shape[0]) if x.is_contiguous() else None
        if config is None:
            return F.linear(x, w)
        return self.run(config, x, w)

    def run(self, config: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
        getattr(self.module, config)(x, w, out, True)
        return out

    @classmethod
    def tune(cls, module: object, weights: dict[tuple[int, int], list[torch.Tensor]],
             sizes: list[int], time_us: TimeUs | None = None) -> Choices:
        """Choose per weight shape (N, K) -> the weights of that shape, and per batch size in
        `sizes` (see the module docstring); `time_us(fn, weights)`: the mean time of fn(w)
        over them (`time_graph_us` on the GPU)."""
        time_us = time_us or time_graph_us
        t0 = time.perf_counter()
        gemm = cls(module, {})
        choices: Choices = {}
        kept = 0
        for (n, k), ws in weights.items():
            choices[n, k] = {}
            if n % 8 or k % 8:  # TMA loads 16-byte rows: cuBLAS
                continue
            for m in sizes:
                x = torch.randn(m, k, dtype=ws[0].dtype, device=ws[0].device)
                t_cublas = time_us(partial(F.linear, x), ws)
                if t_cublas > LAUNCH_BOUND_US:
                    choices[n, k][m] = None
                    continue
                times = {c: time_us(partial(gemm.run, c, x), ws)
                         for c in CONFIGS if batch_tile(c) <= max(64, 2 * m)}
                best = min(times, key=times.__getitem__)
                pick = best if times[best] <= t_cublas + PDL_CREDIT_US else None
                choices[n, k][m] = pick
                kept += pick is not None
        logger.info("GEMMs: CUTLASS with PDL for %d of %d (shape, batch size) pairs, cuBLAS "
                    "for the rest; timed in %.1f s", kept, len(sizes) * len(weights),
                    time.perf_counter() - t0)
        return choices


def time_graph_us(fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor],
                  replays: int = 3) -> float:
    """Mean GPU time of `fn(w)` over `weights` in one CUDA graph (each weight read from HBM
    when together they outsize the L2 cache, as a model's layers do)."""
    fn(weights[0])  # a first call outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(weights))
