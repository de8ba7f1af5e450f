"""The engine with an FP8 KV cache on the GPU (FlashInfer attention, fused layers, CUDA
graphs of every kind) on small random models: the graphs give the eager path's greedy
tokens, the whole-KV decode graphs and the mixed-step graphs choose what the torch-native
FP8 path would (up to a near-tie), FP8 stays close to bf16 KV (teacher-forced logits, and
greedy tokens before the first divergence: printed), and the same memory holds twice the
tokens of bf16 KV."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.engine import Engine, EngineConfig

from ..worker.conftest import open_mixed_gate, save_tiny_model
from .test_models import (
    ARCHS,
    COMMON,
    PROMPTS,
    SEQ,
    _greedy,
    _near_ties_vs_torch_native,
    _teacher_forced,
)

pytestmark = pytest.mark.gpu
FP8_KV = {"kv_cache_dtype": "fp8_e4m3"}


@pytest.fixture(scope="module", params=["llama", "qwen3"])  # head_dim 64 and 128, qk-norm
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    arch = request.param
    path = tmp_path_factory.mktemp(f"gpu-fp8-{arch}")
    save_tiny_model(path, arch, **COMMON, **ARCHS[arch])
    return arch, path


def test_graphs_give_the_eager_tokens(model: Any) -> None:
    """Decode graphs (split-KV at these 5 requests) and the piecewise prefill graphs, against
    the same engine without decode graphs, as tests/gpu/test_models.py checks bf16 KV."""
    path = model[1]
    graphed = _greedy(path, **FP8_KV)
    assert graphed == _greedy(path, cuda_graph_max_bs=0, **FP8_KV)


def test_whole_kv_and_mixed_graphs_choose_the_torch_native_tokens(
    model: Any, monkeypatch: Any
) -> None:
    """72 requests of similar lengths decode through the whole-KV Triton graphs (counted),
    prompt chunks of 8 tokens beside decodes replay the mixed-step graphs (counted); each
    greedy token is the torch-native FP8 path's argmax up to a near-tie."""
    from minisgl_worker.core import Attn, RouteKind
    from minisgl_worker.engine.route import RouteTable

    arch, path = model
    kinds: list[Any] = []
    route = RouteTable.route

    def spy(self: RouteTable, batch: Any) -> Any:
        r = route(self, batch)
        kinds.append((r.kind, r.attn))
        return r

    monkeypatch.setattr(RouteTable, "route", spy)
    open_mixed_gate(monkeypatch)
    prompts = [[(5 * i + 3 * j) % 500 + 3 for i in range(40 + j % 7)] for j in range(72)]
    out = _greedy(path, 8, prompts, max_running=128, kv_tokens=16384, **FP8_KV)
    whole = kinds.count((RouteKind.DECODE_GRAPH, Attn.WHOLE_KV))
    assert whole >= 5, kinds
    ties = _near_ties_vs_torch_native(path, prompts, out, **FP8_KV)
    kinds.clear()
    out = _greedy(path, 24, chunk_size=8, cuda_graph_max_tokens=64, cuda_graph_mixed_tokens=64,
                  **FP8_KV)
    mixed = sum(kind is RouteKind.MIXED_GRAPH for kind, _ in kinds)
    assert mixed >= 5, kinds
    ties += _near_ties_vs_torch_native(path, PROMPTS, out, **FP8_KV)
    print(f"{arch} FP8 KV: {whole} whole-KV decode replays, {mixed} mixed-graph steps, "
          f"{ties} near-ties")


def _agreed(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def test_fp8_stays_close_to_bf16_kv(model: Any) -> None:
    """Teacher-forced logits over 64 positions (a prefix, two decodes, the rest) within 10%
    of bf16 KV's (relative norm), and most greedy tokens come before the first divergence
    from bf16 KV. The same models on CPU (torch-native, bf16): logits 3.1e-2 (llama) and
    4.3e-2 (qwen3) apart, 100% and 99% of the greedy tokens before the first divergence."""
    arch, path = model
    bf16 = _teacher_forced(path, [SEQ])[0]
    fp8 = _teacher_forced(path, [SEQ], **FP8_KV)[0]
    err = float((fp8 - bf16).norm() / bf16.norm())
    agreed = [_agreed(a, b) for a, b in zip(_greedy(path), _greedy(path, **FP8_KV))]
    share = sum(agreed) / (32 * len(PROMPTS))
    print(f"{arch}: FP8 vs bf16 KV, teacher-forced logits relative error {err:.2e}; greedy "
          f"tokens before the first divergence {agreed} ({share:.0%})")
    assert err < 0.1, err
    assert share >= 0.75, agreed


def test_the_same_memory_holds_twice_the_tokens(tmp_path: Path) -> None:
    """KV capacity from the engine's memory plan (20% of the GPU, no graphs) with bf16 and
    with FP8 KV, on a model whose context does not cap it."""
    save_tiny_model(tmp_path, "llama", vocab_size=512, hidden_size=512, intermediate_size=512,
                    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                    max_position_embeddings=131072)
    slots = {}
    for kv in ("auto", "fp8_e4m3"):
        gc.collect()
        torch.cuda.empty_cache()
        engine = Engine(EngineConfig(str(tmp_path), device="cuda", max_running=256,
                                     gpu_memory_fraction=0.2, cuda_graph_max_bs=0,
                                     cuda_graph_max_tokens=0, kv_cache_dtype=kv))
        slots[kv] = engine.kv_pool.num_slots
        engine.shutdown()
        del engine
    ratio = slots["fp8_e4m3"] / slots["auto"]
    print(f"KV capacity in 20% of the GPU: {slots['auto']:,} tokens of bf16, "
          f"{slots['fp8_e4m3']:,} of FP8 ({ratio:.2f}x)")
    assert ratio >= 1.9, slots
