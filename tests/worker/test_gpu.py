"""The engine on CUDA (marked gpu: skipped on CPU): torch-native attention in float32 against
transformers, and FlashInfer in bfloat16 against torch-native on the same weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

from .conftest import LLAMA3_ROPE, Driver, hf_logits, save_tiny_model

pytestmark = pytest.mark.gpu
PROMPTS = [[(7 * i + j) % 250 + 3 for i in range(8 + 9 * j)] for j in range(5)]
SEQ = [(11 * i + 5) % 256 for i in range(100)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("gpu-llama")  # head_dim 64: FlashInfer has no 16
    return path, save_tiny_model(path, hidden_size=256, rope_scaling=LLAMA3_ROPE)


def _chunked_logits(engine: Any, chunks: list[int]) -> torch.Tensor:
    driver = Driver(engine)
    req = driver.new_req(SEQ)
    return torch.cat([driver.extend([req], [n])[0] for n in chunks]).cpu()


def test_torch_backend_float32_matches_transformers(
    model_dir: tuple[Path, Any], engine_factory: Any
) -> None:
    path, ref = model_dir
    engine = engine_factory(path, device="cuda", attention_backend="torch", page_size=4)
    ours = _chunked_logits(engine, [40, 1, 1, 30, 28])
    torch.testing.assert_close(ours, hf_logits(ref, SEQ), atol=1e-3, rtol=0)


def test_greedy_generation_on_cuda_matches_cpu(model_dir: tuple[Path, Any]) -> None:
    sp = SamplingParams(max_new_tokens=16, min_new_tokens=16)
    results = []
    for device in ("cpu", "cuda"):
        llm = LLM(model_dir[0], device=device, dtype="float32", attention_backend="torch",
                  kv_tokens=2048)
        results.append([r["token_ids"] for r in llm.generate(PROMPTS, sp)])
        seeded = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
        assert llm.generate(PROMPTS[:1], seeded) == llm.generate(PROMPTS[:1], seeded)
        llm.shutdown()
    assert results[0] == results[1]


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="no flashinfer")
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_bf16_is_as_close_to_float32_as_torch_bf16(
    model_dir: tuple[Path, Any], engine_factory: Any, page_size: int
) -> None:
    """bf16 rounding differs between kernels, so both are measured against transformers'
    float32 logits: FlashInfer's error must be of the same size as torch-native's."""
    path, ref = model_dir
    exact = hf_logits(ref, SEQ)
    errors = []
    for backend in ("torch", "flashinfer"):
        engine = engine_factory(path, device="cuda", dtype="bfloat16",
                                attention_backend=backend, page_size=page_size)
        errors.append((_chunked_logits(engine, [40, 1, 1, 30, 28]).float() - exact).abs())
    torch_err, fi_err = errors
    assert fi_err.mean() <= 1.5 * torch_err.mean() + 1e-3, (fi_err.mean(), torch_err.mean())
    assert fi_err.max() <= 2 * torch_err.max() + 0.1, (fi_err.max(), torch_err.max())
