"""`--kv-cache-dtype fp8_e4m3` on the real default model (CPU, torch-native attention):
greedy answers agree with the model-dtype KV cache for a good share of their tokens, the
capital of France is still Paris, and the same memory holds four times the tokens of float32
KV. Measured here: 49% of 8 x 32 greedy tokens come before the first divergence with the
calibrated per-layer scales (39% with a scale of 1); bf16 KV, 7 mantissa bits against
e4m3's 3, agrees on all of them, so the gap is e4m3's precision on this 135M model, not the
range (its values sit well inside the scaled range)."""

from __future__ import annotations

from pathlib import Path

import pytest
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import SamplingParams

from .test_reference import PROMPTS as REFERENCE_PROMPTS

PROMPTS = [*REFERENCE_PROMPTS, "The capital of Germany is", "1, 2, 3, 4,",
           "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]
NEW_TOKENS = 32
KV_BYTES = 64 << 20


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(ensure_default_model())


def _run(model_dir: Path, prompts: list[list[int]], kv: str) -> tuple[list[list[int]], int]:
    from minisgl_worker import LLM

    llm = LLM(str(model_dir), kv_cache_dtype=kv, cpu_kv_bytes=KV_BYTES)
    try:
        out = llm.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS,
                                                   ignore_eos=True))
        return [r["token_ids"] for r in out], llm.engine.kv_pool.num_slots
    finally:
        llm.shutdown()


def _agreed(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def test_fp8_kv_agrees_with_the_model_dtype(model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    full, full_slots = _run(model_dir, prompts, "auto")
    fp8, fp8_slots = _run(model_dir, prompts, "fp8_e4m3")
    agreed = [_agreed(a, b) for a, b in zip(full, fp8)]
    share = sum(agreed) / (NEW_TOKENS * len(prompts))
    print(f"fp8 KV: tokens before the first divergence {agreed}, {share:.0%} on average; "
          f"KV capacity {fp8_slots:,} against {full_slots:,} tokens")
    assert share >= 0.4, agreed  # measured 0.49 (see above)
    assert "Paris" in tokenizer.decode(fp8[0])
    assert fp8_slots >= 1.9 * full_slots  # float32 -> e4m3: 4x the tokens in the same bytes
