"""Model configs, model classes and weight loading; `create_model` is the factory."""

from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig
from .llama import LlamaForCausalLM
from .weights import init_random, load_safetensors

__all__ = ["LlamaForCausalLM", "ModelConfig", "create_model"]


def create_model(
    path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
    load_format: str = "safetensors",
) -> LlamaForCausalLM:
    """Build on CPU in float32, load, then move: simple, and the tiny models load fast.
    (Llama, Mistral, Qwen2 and Qwen3 share one class; they differ only in config flags.)"""
    assert load_format in ("safetensors", "dummy"), f"unknown load_format {load_format!r}"
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg)
    if load_format == "dummy":
        init_random(model)
    else:
        load_safetensors(model, Path(path), cfg.tie_word_embeddings)
    model.to(device=device)
    for param in model.parameters():  # not `.to(dtype)`: the RoPE cache stays float32
        param.data = param.data.to(dtype)
    return model.eval()
