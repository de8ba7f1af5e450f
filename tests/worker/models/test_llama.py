"""Our Llama-family model against transformers on tiny random checkpoints (float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.engine import Engine

from ..conftest import LLAMA3_ROPE, Driver, hf_logits, save_tiny_model

TOL = 1e-4
PROMPT = [(7 * i + 3) % 256 for i in range(80)]  # past the 32-position llama3 boundary


def _check_logits(engine: Engine, ref: torch.nn.Module) -> None:
    driver = Driver(engine)
    ours = driver.extend([driver.new_req(PROMPT)], [len(PROMPT)])[0]
    torch.testing.assert_close(ours, hf_logits(ref, PROMPT), atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("llama", {}),
        ("llama", {"rope_scaling": LLAMA3_ROPE}),
        ("llama", {"tie_word_embeddings": False, "attention_bias": True}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 32}),
    ],
    ids=["llama", "llama3-rope", "untied-bias", "linear-rope", "qwen2", "qwen3-qknorm"],
)
def test_logits_match_transformers(
    tmp_path: Path, engine_factory: Any, arch: str, overrides: dict[str, Any]
) -> None:
    ref = save_tiny_model(tmp_path, arch, **overrides)
    _check_logits(engine_factory(tmp_path), ref)


def test_sharded_checkpoint_loads(tmp_path: Path, engine_factory: Any) -> None:
    ref = save_tiny_model(tmp_path / "full", rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    _check_logits(engine_factory(tmp_path / "sharded"), ref)


def test_dummy_weights_are_deterministic(
    tiny_llama: tuple[Path, torch.nn.Module], engine_factory: Any
) -> None:
    path, _ = tiny_llama
    logits = []
    for _ in range(2):
        driver = Driver(engine_factory(path, load_format="dummy"))
        logits.append(driver.extend([driver.new_req(PROMPT[:8])], [8])[0])
    assert torch.equal(logits[0], logits[1]) and torch.isfinite(logits[0]).all()
