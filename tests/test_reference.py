"""Our engine's greedy tokens equal `transformers`' on the real default model (float32, CPU)."""

from pathlib import Path

import pytest
import torch
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import SamplingParams

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "<|im_start|>user\nList three fruits.<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(ensure_default_model())


def transformers_greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    for ids in prompts:  # one at a time: no padding effects in the reference
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        outputs.append(out[0, len(ids) :].tolist())
    return outputs


def test_greedy_tokens_match_transformers(model_dir: Path) -> None:
    from minisgl_worker import LLM
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    expected = transformers_greedy(model_dir, prompts)

    llm = LLM(str(model_dir))
    try:
        results = llm.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
    finally:
        llm.shutdown()  # the engine's context is process-global: free it for later tests
    ours = [r["token_ids"] for r in results]
    for i, (got, want) in enumerate(zip(ours, expected, strict=True)):
        assert got == want, f"prompt {i}: {PROMPTS[i]!r}"
    assert any(len(t) == NEW_TOKENS for t in expected), "some prompt should hit the length limit"
