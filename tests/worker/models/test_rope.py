"""RoPE frequency scaling against transformers' own initialisers (CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from minisgl_worker.layers.rotary import RopeScaling, rope_frequencies
from minisgl_worker.models.config import _rope

CASES: list[dict[str, Any]] = [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    {"rope_type": "linear", "factor": 2.0},
]


@pytest.mark.parametrize("params", CASES, ids=[c["rope_type"] for c in CASES])
def test_frequencies_match_transformers(params: dict[str, Any]) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = {"rope_scaling": {**params}, "rope_theta": 1e6, "max_position_embeddings": 131072}
    config = transformers.LlamaConfig(
        hidden_size=1024, num_attention_heads=8, head_dim=128, rope_theta=1e6,
        max_position_embeddings=131072, rope_scaling={**params},
    )
    ref_inv, ref_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, torch.device("cpu"))
    theta, scaling = _rope(raw)
    assert isinstance(scaling, RopeScaling) and theta == 1e6
    inv, factor = rope_frequencies(128, theta, scaling)
    torch.testing.assert_close(inv, ref_inv.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor)
