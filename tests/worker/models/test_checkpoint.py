"""The checkpoint check: a folder's safetensors against the model its config.json describes,
from the headers alone, before anything is loaded; and the load itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from minisgl_worker.models import CheckpointError, ModelConfig, check_checkpoint, create_model
from minisgl_worker.models.weights import checkpoint_shapes
from safetensors.torch import save_file

CFG = ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_context=128,
)


def _tensors(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=gen).to(torch.bfloat16)
            for name, shape in checkpoint_shapes(cfg)}


def test_a_checkpoint_that_matches_loads_every_tensor(tmp_path: Path) -> None:
    tensors = _tensors(CFG)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    check_checkpoint(tmp_path, CFG)
    model = create_model(tmp_path, CFG, torch.bfloat16, torch.device("cpu"))
    down = dict(model.named_parameters())["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(down, tensors["model.layers.1.mlp.down_proj.weight"])


@pytest.mark.parametrize(("edit", "says"), [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
     "model.layers.1.mlp.up_proj.weight is missing"),
    (lambda t: t.update({"model.layers.0.mlp.down_proj.weight": torch.zeros(32, 40)}),
     "model.layers.0.mlp.down_proj.weight is [32, 40], config.json makes it [32, 48]"),
    (lambda t: t.update({"model.layers.2.input_layernorm.weight": torch.ones(32)}),
     "model.layers.2.input_layernorm.weight is not a tensor of this model"),
    (lambda t: t.update({"model.norm.weight": torch.ones(32, dtype=torch.float8_e4m3fn)}),
     "model.norm.weight is F8_E4M3 (weights must be BF16, F16, F32)"),
])
def test_a_checkpoint_of_another_model_is_refused_naming_the_tensor(
        tmp_path: Path, edit: object, says: str) -> None:
    tensors = _tensors(CFG)
    edit(tensors)  # type: ignore[operator]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        check_checkpoint(tmp_path, CFG)
    assert str(e.value) == f"{tmp_path} does not hold the model its config.json describes: {says}"
    with pytest.raises(CheckpointError):  # loading checks first: nothing half-loaded
        create_model(tmp_path, CFG, torch.bfloat16, torch.device("cpu"))


def test_no_files_or_a_sharded_index_naming_an_absent_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no \\*.safetensors in"):
        check_checkpoint(tmp_path, CFG)
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(CheckpointError, match="names files that are not there: "
                       "\\['model-00001-of-00002.safetensors'\\]"):
        check_checkpoint(tmp_path, CFG)
