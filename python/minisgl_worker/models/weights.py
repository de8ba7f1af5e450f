"""Safetensors loading (one file or a sharded index) and random weights for benchmarks.

HF names map onto ours by suffix: q/k/v_proj go into `qkv_proj` shards "q"/"k"/"v",
gate/up_proj into `gate_up_proj` shards "gate"/"up". Each module's `load(shard, name,
tensor)` does its own TP slicing."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

logger = logging.getLogger(__name__)

_MERGED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", "gate"),
    ".up_proj.": (".gate_up_proj.", "up"),
}


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / f for f in files]
    files = sorted(path.glob("*.safetensors"))
    assert files, f"no *.safetensors in {path}"
    return files


def _iter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                yield name, f.get_tensor(name)


def _map_name(hf_name: str) -> tuple[str, str | None]:
    for old, (new, shard) in _MERGED.items():
        if old in hf_name:
            return hf_name.replace(old, new), shard
    return hf_name, None


def load_safetensors(model: nn.Module, path: Path, tied: bool) -> None:
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for hf_name, tensor in _iter_tensors(path):
        if "rotary_emb.inv_freq" in hf_name or (tied and hf_name == "lm_head.weight"):
            continue
        name, shard = _map_name(hf_name)
        assert name in params, f"checkpoint tensor {hf_name} has no parameter ({name})"
        module_name, _, param_name = name.rpartition(".")
        module = modules[module_name]
        if hasattr(module, "load"):
            module.load(shard, param_name, tensor)
        else:
            params[name].data.copy_(tensor)
        loaded.add(name)
    expected = {n for n in params if not (tied and n == "lm_head.weight")}
    missing = sorted(expected - loaded)
    assert not missing, f"parameters missing from the checkpoint: {missing[:8]}"


def init_random(model: nn.Module, seed: int = 0) -> None:
    """`load_format="dummy"`: small normal weights, unit norms; deterministic per seed and
    device. Drawn on the parameters' device (an 8B model fills in well under a second on a
    GPU), in float32 and rounded once."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
            continue
        for row in param.data.view(-1, param.shape[-1]).split(4096):  # bounded float32 temp
            row.copy_(torch.randn(row.shape, generator=gen, device=device) * 0.02)
