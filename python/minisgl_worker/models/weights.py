"""Safetensors loading (one file or a sharded index) and random weights for benchmarks.

HF names map onto ours by suffix: q/k/v_proj go into `qkv_proj` shards "q"/"k"/"v",
gate/up_proj into `gate_up_proj` shards "gate"/"up". Each module's `load(shard, name,
tensor)` does its own TP slicing, on a lazy safetensors slice: a rank reads only its part."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from ..startup import progress
from .config import ModelConfig

logger = logging.getLogger(__name__)

_MERGED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", "gate"),
    ".up_proj.": (".gate_up_proj.", "up"),
}


# Weights this worker computes with; a quantized or integer tensor is refused, not cast.
WEIGHT_DTYPES = ("BF16", "F16", "F32")


class CheckpointError(ValueError):
    """Safetensors that do not hold the model config.json describes; names the tensor."""


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = [path / f for f in sorted(set(json.loads(index.read_text())["weight_map"]
                                                  .values()))]
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise CheckpointError(f"{index} names files that are not there: {absent[:4]}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {path}")
    return files


def check_checkpoint(path: Path, cfg: ModelConfig) -> None:
    """The folder's tensors (names, shapes, dtypes, from the files' headers alone) against
    those `cfg` needs, so a checkpoint of another model fails before anything is loaded."""
    expected = dict(checkpoint_shapes(cfg))
    found: set[str] = set()
    problems = []
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                found.add(name)
                if _skipped(name, cfg.tie_word_embeddings):
                    continue
                tensor = f.get_slice(name)
                shape, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
                if name not in expected:
                    problems.append(f"{name} is not a tensor of this model")
                elif shape != expected[name]:
                    problems.append(f"{name} is {list(shape)}, config.json makes it "
                                    f"{list(expected[name])}")
                elif dtype not in WEIGHT_DTYPES:
                    problems.append(f"{name} is {dtype} (weights must be "
                                    f"{', '.join(WEIGHT_DTYPES)})")
    problems += [f"{name} is missing" for name in expected if name not in found]
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise CheckpointError(f"{path} does not hold the model its config.json describes: "
                              f"{'; '.join(problems[:4])}{more}")


def _skipped(hf_name: str, tied: bool) -> bool:
    return "rotary_emb.inv_freq" in hf_name or (tied and hf_name == "lm_head.weight")


def _iter_tensors(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, lazy slice) for every tensor: indexing a slice reads only those rows or
    columns from the file, so each TP rank reads only its part."""
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                yield name, f.get_slice(name)


def _map_name(hf_name: str) -> tuple[str, str | None]:
    for old, (new, shard) in _MERGED.items():
        if old in hf_name:
            return hf_name.replace(old, new), shard
    return hf_name, None


def load_tensors(model: nn.Module, tensors: Iterable[tuple[str, Any]], tied: bool) -> None:
    """Copy HF-named tensors (or lazy slices) into the model: each parallel module's
    `load` takes its rank's slice; a replicated parameter takes the whole tensor."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for hf_name, tensor in tensors:
        if _skipped(hf_name, tied):
            continue
        name, shard = _map_name(hf_name)
        assert name in params, f"checkpoint tensor {hf_name} has no parameter ({name})"
        module_name, _, param_name = name.rpartition(".")
        module = modules[module_name]
        if hasattr(module, "load"):
            module.load(shard, param_name, tensor)
        else:
            whole = tensor[:]
            assert whole.shape == params[name].shape, (
                f"{hf_name}: checkpoint {tuple(whole.shape)}, parameter "
                f"{tuple(params[name].shape)}")
            params[name].data.copy_(whole)
        loaded.add(name)
    expected = {n for n in params if not (tied and n == "lm_head.weight")}
    missing = sorted(expected - loaded)
    assert not missing, f"parameters missing from the checkpoint: {missing[:8]}"


def load_safetensors(model: nn.Module, path: Path, cfg: ModelConfig) -> None:
    """Every tensor of the folder into `model`, with a bar per tensor on a terminal."""
    check_checkpoint(path, cfg)
    count = 0
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            count += len(f.keys())
    load_tensors(model, progress(_iter_tensors(path), "loading weights", "tensor", count),
                 cfg.tie_word_embeddings)


def checkpoint_shapes(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The HF names and full shapes of a checkpoint of `cfg` (what random weights draw)."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    yield "model.embed_tokens.weight", (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{proj}_proj.weight", (rows, h)
            if cfg.qkv_bias:
                yield p + f"self_attn.{proj}_proj.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (h, q)
        if cfg.o_bias:
            yield p + "self_attn.o_proj.bias", (h,)
        if cfg.qk_norm:
            yield p + "self_attn.q_norm.weight", (d,)
            yield p + "self_attn.k_norm.weight", (d,)
        yield p + "mlp.gate_proj.weight", (inter, h)
        yield p + "mlp.up_proj.weight", (inter, h)
        yield p + "mlp.down_proj.weight", (h, inter)
    yield "model.norm.weight", (h,)
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (cfg.vocab_size, h)


def init_random(model: nn.Module, cfg: ModelConfig, seed: int = 0) -> None:
    """`load_format="dummy"`: small normal weights, unit norms; deterministic per seed and
    device. Each rank draws every full tensor in turn on its device (in float32, rounded
    once; a large one in blocks of rows) and keeps its slice through the same `load` as a
    checkpoint, so a TP group holds exactly the slices of the tp == 1 model. An 8B model
    draws in about a second on a GPU."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw() -> Iterator[tuple[str, torch.Tensor]]:
        for name, shape in checkpoint_shapes(cfg):
            if name.endswith("norm.weight"):
                yield name, torch.ones(shape, dtype=dtype, device=device)
                continue
            full = torch.empty(shape, dtype=dtype, device=device)
            for rows in full.view(-1, shape[-1]).split(4096):  # bounded float32 temp
                rows.copy_(torch.randn(rows.shape, generator=gen, device=device) * 0.02)
            yield name, full

    load_tensors(model, draw(), cfg.tie_word_embeddings)
