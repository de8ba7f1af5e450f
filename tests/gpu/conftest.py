"""GPU test set-up: compile every FlashInfer module the tests use in one parallel ninja run
(much faster than one family at a time on first use), and report how long it took."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from .paged import LAYOUTS, prefill_backends


@pytest.fixture(scope="session", autouse=True)
def _flashinfer_jit() -> None:
    from minisgl_worker.attention.flashinfer_jit import build_jit
    from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
    from minisgl_worker.layers import cuda_ops, gemm

    device = torch.device("cuda")
    specs = cuda_ops.jit_specs()
    if gemm.supported(device, torch.bfloat16):
        specs.append(gemm.jit_spec())
    for hq, hkv, d in LAYOUTS.values():
        for backend in prefill_backends(d):
            attn = FlashInferPagedAttention(hq, hkv, d, 16, torch.bfloat16, device,
                                            prefill_backend=backend)  # type: ignore[arg-type]
            specs += attn.jit_specs()
        # over an FP8 KV cache (test_fp8_kv.py, test_fp8_engine.py): FA2 only
        specs += FlashInferPagedAttention(hq, hkv, d, 16, torch.bfloat16, device,
                                          kv_dtype=torch.float8_e4m3fn).jit_specs()
    names = sorted({s.name for s in specs})
    todo = [n for n in names if not any(s.name == n and s.is_compiled for s in specs)]
    t0 = time.perf_counter()
    try:
        build_jit(specs)
    except RuntimeError as e:  # ninja failed: the tests then compile module by module
        print(f"JIT prebuild failed: {e!r}"[:2000], file=sys.stderr)
    print(f"\nJIT prebuild: {len(names)} modules ({len(todo)} not yet compiled) in "
          f"{time.perf_counter() - t0:.1f} s:\n  " + "\n  ".join(names), file=sys.stderr)
