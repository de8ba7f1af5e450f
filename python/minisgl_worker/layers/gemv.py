"""Our decode-batch GEMM for Hopper (gemv_sm90.cu): out = x @ w^T for x of at most MAX_M
rows, bf16, launched with PDL; and its SiLU-and-mul variant for a [gate | up] weight.

At decode batches a GEMM is the weight stream, and cuBLAS reads Llama-3.1-8B's layers at
~3.7 TB/s of the H200's ~4.1 TB/s read roof, plus a split-K reduction kernel and a launch
gap per GEMM. gemv_sm90.cu streams the weights with no second kernel, starts its loads
before the previous kernel ends (PDL), and can fold SiLU-and-mul into gate_up's epilogue.
Which GEMMs it runs is chosen by timing (gemm.py's `Sm90Gemm.tune`), as CUTLASS's are."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec

SOURCE = Path(__file__).with_name("gemv_sm90.cu")
MAX_M = 16  # two n8 tiles of the mma
STEP_K = 32  # k of one step of a warp (gemv_sm90.cu's kStep)
TILE_ROWS = 16
# name -> (warps a CTA, steps in flight a thread, 16-row tiles a CTA, SiLU-and-mul)
CONFIGS = {
    f"gemv_{'silu_' if silu else ''}w{warps}_u{u}_r{r}": (warps, u, r, silu)
    for warps, u, r, silu in [
        (4, 4, 1, False), (8, 2, 1, False), (8, 4, 1, False), (8, 8, 1, False),
        (16, 4, 1, False), (4, 4, 2, False), (8, 4, 2, False),
        (4, 4, 2, True), (8, 2, 2, True), (8, 4, 2, True), (16, 2, 2, True),
    ]
}
PLAIN = [name for name, (_, _, _, silu) in CONFIGS.items() if not silu]
SILU = [name for name, (_, _, _, silu) in CONFIGS.items() if silu]


def module_name() -> str:
    """Changes with the source or the configurations, so a stale build is never loaded."""
    digest = hashlib.sha256(SOURCE.read_bytes() + repr(CONFIGS).encode()).hexdigest()
    return f"minisgl_gemv_sm90_{digest[:10]}"


def fits(config: str, m: int, n: int, k: int) -> bool:
    """Whether `config` computes x (m, k) @ w (n, k)^T (for SiLU: n = 2 * intermediate)."""
    _, _, r, silu = CONFIGS[config]
    rows = n // 2 if silu else n
    tile = TILE_ROWS if silu else TILE_ROWS * r
    return 0 < m <= MAX_M and k % STEP_K == 0 and rows % tile == 0 and (not silu or n % 2 == 0)


def loadable(x: torch.Tensor) -> bool:
    """The kernel loads 16 bytes at a time: x contiguous and 16-byte aligned."""
    return x.is_contiguous() and x.data_ptr() % 16 == 0


def jit_spec() -> JitSpec:
    """One FlashInfer JIT module; each configuration compiles gemv_sm90.cu in its own
    translation unit and exports one function named after it."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit import gen_jit_spec
    from flashinfer.jit.core import sm90a_nvcc_flags
    from flashinfer.jit.utils import write_if_different

    name = module_name()
    sources = []
    for config, (warps, u, r, silu) in CONFIGS.items():
        defines = {"GV_NAME": config, "GV_WARPS": warps, "GV_U": u, "GV_R": r,
                   "GV_SILU": "true" if silu else "false"}
        path = jit_env.FLASHINFER_GEN_SRC_DIR / name / f"{config}.cu"
        text = "".join(f"#define {key} {value}\n" for key, value in defines.items())
        write_if_different(path, f'{text}#include "{SOURCE}"\n')
        sources.append(path)
    return gen_jit_spec(name, sources, extra_cuda_cflags=list(sm90a_nvcc_flags))


def run(module: object, config: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T, or for a SiLU configuration silu(gate) * up: (M, N / 2)."""
    silu = CONFIGS[config][3]
    out = torch.empty((x.shape[0], w.shape[0] // 2 if silu else w.shape[0]), dtype=x.dtype,
                      device=x.device)
    getattr(module, config)(x, w, out, True)
    return out
