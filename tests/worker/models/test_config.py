from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from minisgl_worker.models import ModelConfig, ModelConfigError

BASE: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512,
}


def _write(path: Path, config: dict[str, Any], generation: dict[str, Any] | None = None) -> Path:
    (path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def test_defaults_head_dim_kv_heads_and_rope(tmp_path: Path) -> None:
    cfg = ModelConfig.from_hf(_write(tmp_path, BASE))
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_theta) == (16, 4, 10000.0)
    assert cfg.rope_scaling.rope_type == "default" and not cfg.tie_word_embeddings
    assert cfg.max_context == 512 and cfg.eos_token_ids == ()


def test_legacy_rope_scaling_and_eos_lists(tmp_path: Path) -> None:
    raw = {
        **BASE, "rope_theta": 500000.0, "eos_token_id": [5, 6], "tie_word_embeddings": True,
        "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }
    cfg = ModelConfig.from_hf(_write(tmp_path, raw, {"eos_token_id": [6, 7]}))
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.factor == 32.0
    assert cfg.rope_scaling.rope_type == "llama3" and cfg.tie_word_embeddings
    assert cfg.eos_token_ids == (5, 6, 7)


def test_rope_parameters_and_qwen_flags(tmp_path: Path) -> None:
    raw = {**BASE, "model_type": "qwen2", "rope_parameters": {"rope_theta": 1e6,
                                                                "rope_type": "default"}}
    cfg = ModelConfig.from_hf(_write(tmp_path, raw))
    assert cfg.rope_theta == 1e6 and cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm
    cfg3 = ModelConfig.from_hf(_write(tmp_path, {**BASE, "model_type": "qwen3"}))
    assert cfg3.qk_norm and not cfg3.qkv_bias


@pytest.mark.parametrize(("change", "says"), [
    ({"model_type": "mixtral"}, "model_type 'mixtral' is not supported (supported: llama"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}},
     "quantization_config (quant_method 'awq') is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"mlp_bias": True}, "mlp_bias true is not supported"),
    ({"num_key_value_heads": 3}, ("num_attention_heads (4) must be a multiple of "
     "num_key_value_heads (3)")),
    ({"rope_scaling": {"rope_type": "longrope"}}, "rope_type 'longrope' is not supported"),
    ({"num_attention_heads": None}, "num_attention_heads is missing"),
])
def test_a_config_we_cannot_serve_is_refused_naming_the_field(
        tmp_path: Path, change: dict[str, Any], says: str) -> None:
    raw = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError) as e:
        ModelConfig.from_hf(_write(tmp_path, raw))
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: ") and says in str(e.value)


def test_a_missing_or_broken_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="config.json does not exist"):
        ModelConfig.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelConfigError, match="config.json is not JSON"):
        ModelConfig.from_hf(tmp_path)


@pytest.mark.parametrize(("window", "context", "window_kept"), [
    ({"sliding_window": 128}, 128, 128),  # Mistral-7B-v0.1: on when set
    ({"sliding_window": None}, 512, None),  # Mistral v0.2+
    ({"sliding_window": 4096}, 512, None),  # longer than the context: no cap
    ({"use_sliding_window": False, "sliding_window": 128}, 512, None),  # Qwen2.5
    ({"use_sliding_window": True, "sliding_window": 128}, 128, 128),
])
def test_a_sliding_window_shorter_than_the_context_caps_it(
        tmp_path: Path, window: dict[str, Any], context: int, window_kept: int | None) -> None:
    cfg = ModelConfig.from_hf(_write(tmp_path, {**BASE, **window}))
    assert (cfg.max_context, cfg.sliding_window) == (context, window_kept)
