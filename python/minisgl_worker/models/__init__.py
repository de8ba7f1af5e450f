"""Model configs, model classes and weight loading; `create_model` is the factory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..layers import Kernels
from .config import ModelConfig, ModelConfigError
from .llama import LlamaForCausalLM, linear_shapes
from .weights import CheckpointError, check_checkpoint, init_random, load_safetensors

__all__ = ["CheckpointError", "LlamaForCausalLM", "ModelConfig", "ModelConfigError",
           "check_checkpoint", "create_model", "linear_shapes"]


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def create_model(
    path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
    load_format: str = "safetensors", kernels: Kernels | None = None,
) -> LlamaForCausalLM:
    """Build directly on the device in the model dtype (an 8B model never exists in float32
    or on the host), then load into it or fill it with random weights there. The RoPE
    cos/sin cache is created in float32 explicitly. (Llama, Mistral, Qwen2 and Qwen3 share
    one class; they differ only in config flags.) `kernels`: what the layers run (torch ops
    by default)."""
    assert load_format in ("safetensors", "dummy"), f"unknown load_format {load_format!r}"
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(cfg, kernels)
    if load_format == "dummy":
        init_random(model, cfg)
    else:
        load_safetensors(model, Path(path), cfg)
    return model.eval()
