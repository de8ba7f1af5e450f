"""The GEMM choice of gemm.py (cuBLAS, CUTLASS or gemv; and where gate_up's SiLU-and-mul is
fused), made once and kept on disk.

Timing picks between candidates a few hundred nanoseconds apart, so two starts could run
different kernels and give different greedy tokens (bf16 rounding). The choice is keyed by
everything it depends on (the GPU, the library versions, the kernels' source, the weight
shapes and batch sizes, the thresholds) and written as JSON beside FlashInfer's JIT cache;
a start with the same key reads it instead of timing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from . import gemm, gemv
from .gemm import Choices, Sm90Gemm, TimeUs

logger = logging.getLogger(__name__)


def cache_key(device: torch.device, dtype: torch.dtype, shapes: dict[tuple[int, int], int],
              sizes: list[int]) -> dict[str, object]:
    """What the choice depends on (JSON-able)."""
    import flashinfer

    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "sms": props.multi_processor_count,
            "capability": list(torch.cuda.get_device_capability(device)),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "flashinfer": flashinfer.__version__, "module": gemm.module_name(),
            "gemv": gemv.module_name(),
            "dtype": str(dtype), "shapes": sorted([*s, c] for s, c in shapes.items()),
            "sizes": sizes, "pdl_credit_us": gemm.PDL_CREDIT_US,
            "launch_bound_us": gemm.LAUNCH_BOUND_US}


def choose(cutlass: object, gemv_module: object | None, shapes: dict[tuple[int, int], int],
           sizes: list[int], dtype: torch.dtype, device: torch.device, cache_dir: Path,
           key: dict[str, object], l2_bytes: int, gate_up: tuple[int, int] | None = None,
           silu_and_mul: Callable[[torch.Tensor], torch.Tensor] | None = None,
           time_us: TimeUs | None = None) -> Sm90Gemm:
    """The cached choice for `key`, or a new one timed over random weights of `shapes`
    ((N, K) -> how many layers hold one) and kept in `cache_dir`; with `gate_up` (one of
    `shapes`) and `silu_and_mul`, also where that GEMM and SiLU-and-mul run as one kernel."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / f"gemm-choices-{digest}.json"
    if path.exists():
        choices, kept_silu = _load(path)
        logger.info("GEMMs: the choice kept in %s", path)
        return Sm90Gemm(cutlass, gemv_module, choices, kept_silu)
    weights = {shape: _weights(shape, count, dtype, device, l2_bytes)
               for shape, count in shapes.items()}
    choices = Sm90Gemm.tune(cutlass, gemv_module, weights, sizes, time_us)
    silu: Choices = {}
    if gate_up is not None and silu_and_mul is not None and gemv_module is not None:
        silu = Sm90Gemm(cutlass, gemv_module, choices).tune_silu(
            weights[gate_up], sizes, silu_and_mul, time_us)
    del weights
    _save(path, key, choices, silu)
    return Sm90Gemm(cutlass, gemv_module, choices, silu)


def _weights(shape: tuple[int, int], count: int, dtype: torch.dtype, device: torch.device,
             l2_bytes: int) -> list[torch.Tensor]:
    """Enough random weights of `shape` to stream from HBM as a model's layers do (together
    three times the L2 cache), at most `count`."""
    n, k = shape
    copies = min(count, max(2, -(-3 * l2_bytes // (n * k * dtype.itemsize))))
    return [torch.randn(n, k, dtype=dtype, device=device) * 0.02 for _ in range(copies)]


def _rows(choices: Choices) -> list[list[object]]:
    return [[n, k, m, pick] for (n, k), by_m in choices.items() for m, pick in by_m.items()]


def _save(path: Path, key: dict[str, object], choices: Choices, silu: Choices) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shapes = [[n, k] for n, k in choices]
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "shapes": shapes, "choices": _rows(choices),
                   "silu_shapes": [[n, k] for n, k in silu], "silu": _rows(silu)}, f)
    os.replace(tmp, path)  # a reader never sees half a file


def _load(path: Path) -> tuple[Choices, Choices]:
    data = json.loads(path.read_text())
    known = {None, *gemm.CONFIGS, *gemv.CONFIGS}
    tables = []
    for shapes, rows in (("shapes", "choices"), ("silu_shapes", "silu")):
        table: Choices = {(n, k): {} for n, k in data[shapes]}
        for n, k, m, pick in data[rows]:
            assert pick in known, f"{path}: unknown configuration {pick}"
            table[n, k][m] = pick
        tables.append(table)
    return tables[0], tables[1]
