"""The CUTLASS-or-cuBLAS choice of gemm.py, made once and kept on disk.

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
from pathlib import Path

import torch

from . import gemm
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
            "dtype": str(dtype), "shapes": sorted([*s, c] for s, c in shapes.items()),
            "sizes": sizes, "pdl_credit_us": gemm.PDL_CREDIT_US,
            "launch_bound_us": gemm.LAUNCH_BOUND_US}


def choose(module: object, shapes: dict[tuple[int, int], int], sizes: list[int],
           dtype: torch.dtype, device: torch.device, cache_dir: Path, key: dict[str, object],
           l2_bytes: int, time_us: TimeUs | None = None) -> Sm90Gemm:
    """The cached choice for `key`, or a new one timed over random weights of `shapes`
    ((N, K) -> how many layers hold one) and kept in `cache_dir`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / f"gemm-choices-{digest}.json"
    if path.exists():
        choices = _load(path)
        logger.info("GEMMs: the choice kept in %s", path)
        return Sm90Gemm(module, choices)
    weights = {shape: _weights(shape, count, dtype, device, l2_bytes)
               for shape, count in shapes.items()}
    choices = Sm90Gemm.tune(module, weights, sizes, time_us)
    del weights
    _save(path, key, choices)
    return Sm90Gemm(module, choices)


def _weights(shape: tuple[int, int], count: int, dtype: torch.dtype, device: torch.device,
             l2_bytes: int) -> list[torch.Tensor]:
    """Enough random weights of `shape` to stream from HBM as a model's layers do (together
    three times the L2 cache), at most `count`."""
    n, k = shape
    copies = min(count, max(2, -(-3 * l2_bytes // (n * k * dtype.itemsize))))
    return [torch.randn(n, k, dtype=dtype, device=device) * 0.02 for _ in range(copies)]


def _save(path: Path, key: dict[str, object], choices: Choices) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [[n, k, m, pick] for (n, k), by_m in choices.items() for m, pick in by_m.items()]
    shapes = [[n, k] for n, k in choices]
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"key": key, "shapes": shapes, "choices": rows}, f)
    os.replace(tmp, path)  # a reader never sees half a file


def _load(path: Path) -> Choices:
    data = json.loads(path.read_text())
    choices: Choices = {(n, k): {} for n, k in data["shapes"]}
    for n, k, m, pick in data["choices"]:
        assert pick is None or pick in gemm.CONFIGS, f"{path}: unknown configuration {pick}"
        choices[n, k][m] = pick
    return choices
