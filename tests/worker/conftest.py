"""Tiny random HF models saved to disk, and helpers that drive our engine directly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from minisgl_worker.core import Batch, Req
from minisgl_worker.engine import Engine, EngineConfig
from minisgl_worker.kvcache import NaiveCache, PageAllocator
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.cache import CacheManager
from minisgl_worker.scheduler.table import TableManager

LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def save_tiny_model(path: Path, arch: str = "llama", **overrides: Any) -> Any:
    """A 2-layer random model of the given HF architecture, saved with save_pretrained."""
    import transformers

    kwargs: dict[str, Any] = {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "tie_word_embeddings": True, "eos_token_id": 2,
        "bos_token_id": 1,
        "initializer_range": 0.2,  # big enough that greedy outputs are not all one token
        **overrides,
    }
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(**kwargs)).eval()
    model.save_pretrained(path)
    return model


def save_byte_tokenizer(path: Path) -> None:
    """A tokenizer.json whose 256 ids are the 256 bytes (GPT-2's byte-level alphabet, no
    merges), for grammars on the tiny models (their vocabulary is 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]  # mapped past 255, in order
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(rest)}
    tokenizer = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """Llama with llama3 RoPE scaling (the scaling matters past 32 positions)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_model(path, rope_scaling=LLAMA3_ROPE)


@pytest.fixture
def engine_factory() -> Iterator[Any]:
    """Builds engines on the tiny models; shuts each down (one global context at a time)."""
    engines: list[Engine] = []

    def make(path: Path, **options: Any) -> Engine:
        for e in engines:
            e.shutdown()
        # Page 1 unless a test asks for more: the tests count KV in tokens.
        options = {"device": "cpu", "dtype": "float32", "kv_tokens": 1024, "page_size": 1,
                   **options}
        engines.append(Engine(EngineConfig(model_path=str(path), **options)))
        return engines[-1]

    yield make
    for e in engines:
        e.shutdown()


class Driver:
    """Feeds one request through an engine chunk by chunk and returns every position's
    logits: the lowest level at which paged attention can be checked against a reference."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = TableManager(engine.page_table)
        self.cache = CacheManager(
            PageAllocator(engine.kv_pool.num_pages), NaiveCache(), engine.page_table,
            engine.page_size,
        )
        self._next_rid = 0

    def new_req(self, ids: list[int]) -> Req:
        req = Req(rid=self._next_rid, input_ids=ids, sampling=SamplingParams())
        self._next_rid += 1
        req.table_idx = self.table.allocate()
        self.cache.admit(req)
        return req

    def extend(self, reqs: list[Req], lens: list[int]) -> list[torch.Tensor]:
        """Extend each req by lens[i] of its input_ids; logits (n_i, V) per req."""
        locs = []
        for req, n in zip(reqs, lens):
            req.device_len = req.cached_len + n
            locs.append(self.cache.extend(req, req.device_len))
        ids = [t for r in reqs for t in r.input_ids[r.cached_len : r.device_len]]
        pos = [p for r in reqs for p in range(r.cached_len, r.device_len)]
        assert len(ids) == len(pos) == sum(lens), "extend past the end of a prompt"
        device = self.engine.device
        self.cache.flush_table()
        batch = Batch(
            reqs=reqs, input_ids=torch.tensor(ids, device=device),
            positions=torch.tensor(pos, device=device), out_loc=torch.from_numpy(np.concatenate(locs)).to(device),
            extend_lens=list(lens),
        )
        self.engine.attn_backend.prepare(batch, self.engine.routes.eager(batch))
        with torch.inference_mode(), self.engine.ctx.forward_batch(batch):
            indices = torch.arange(len(ids), device=device)
            logits = self.engine.model(batch.input_ids, batch.positions, indices)
        for req in reqs:
            req.cached_len = req.device_len
        return list(logits.split(lens))


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # (T, V)


def open_mixed_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the whole mixed-step graphs (engine/graphs/mixed.py) take a test's small batches: their
    gate, for speed only, keeps the batches whose eager FA2 plan would tile or split
    differently (at least ~34 requests on an H200). Call before building the engine."""
    from minisgl_worker.engine import route

    monkeypatch.setattr(route, "min_requests", lambda num_sms, num_kv_heads: 1)
    monkeypatch.setattr(route, "QUERY_TILE", 1 << 30)
