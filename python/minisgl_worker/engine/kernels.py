"""The kernels the engine builds the model with (`layers.Kernels`), chosen before the model
exists: FlashInfer's fused ops with FlashInfer attention in bf16/fp16 (every JIT module the
engine uses compiled in one parallel build first), and on Hopper in bf16, with decode
graphs, the GEMM of each bias-free linear (layers/gemm.py, the choice kept on disk by
layers/gemm_choice.py) unless `gemm="cublas"`."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from ..layers import Kernels, gemm, gemm_choice
from ..models import ModelConfig, linear_shapes

if TYPE_CHECKING:
    from flashinfer.jit import JitSpec

logger = logging.getLogger(__name__)

GEMMS = ("auto", "cublas")


def fused_kernels(backend_name: str, dtype: torch.dtype) -> bool:
    return backend_name == "flashinfer" and dtype != torch.float32


def choose_kernels(cfg: ModelConfig, fused: bool, dtype: torch.dtype, kv_dtype: torch.dtype,
                   device: torch.device, page_size: int, decode_sizes: list[int],
                   gemm_option: str) -> Kernels:
    """kv_dtype: the KV pool's (the attention kernels built read it); decode_sizes: the
    decode graphs' batch sizes, at which the GEMMs are chosen."""
    assert gemm_option in GEMMS, f"unknown gemm {gemm_option!r} (one of {GEMMS})"
    if not fused:
        return Kernels()
    spec = None
    if gemm_option == "auto" and decode_sizes and gemm.supported(device, dtype):
        spec = gemm.jit_spec()
    if not _build_jit(cfg, page_size, dtype, kv_dtype, device,
                      [spec] if spec else []) or spec is None:
        return Kernels(fused=True)
    from flashinfer.jit import env as jit_env

    shapes = linear_shapes(cfg)
    key = gemm_choice.cache_key(device, dtype, shapes, decode_sizes)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    with torch.inference_mode():
        choice = gemm_choice.choose(spec.build_and_load(), shapes, decode_sizes, dtype, device,
                                    jit_env.FLASHINFER_WORKSPACE_DIR / "minisgl", key, l2)
    torch.cuda.empty_cache()  # the timing's weights and graph pools, before the memory plan
    return Kernels(fused=True, gemm=choice)


def _build_jit(cfg: ModelConfig, page_size: int, dtype: torch.dtype, kv_dtype: torch.dtype,
               device: torch.device, optional: list[JitSpec]) -> bool:
    """Compile every FlashInfer module the engine uses, and the `optional` JIT specs, in one
    parallel ninja run (restored AOT modules are skipped), before any first use compiles
    them one by one. Returns whether the optional ones were built."""
    from ..attention.flashinfer_jit import build_jit_optional
    from ..attention.flashinfer_kernels import FlashInferPagedAttention
    from ..layers import cuda_ops

    t0 = time.perf_counter()
    specs = cuda_ops.jit_specs()
    # An FP8 pool's kernels, and the model dtype's too: the memory profile and the FP8
    # scales' calibration (engine/memory.py, kv_scales.py) run on a model-dtype pool.
    for kv in {dtype, kv_dtype}:
        specs += FlashInferPagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                          page_size, dtype, device, kv_dtype=kv).jit_specs()
    built = build_jit_optional(specs, optional)
    logger.info("FlashInfer modules ready in %.1f s", time.perf_counter() - t0)
    return built
