"""The offline API at tp 2 (this process is rank 0; rank 1 is spawned, gloo on CPU) against
transformers: greedy tokens match with KV heads split and with one KV head replicated
(and a vocabulary tp does not divide); sampled tokens' logprobs match the reference given
those very tokens, which holds only while both ranks feed the same tokens back (a rank
that sampled its own token would put another token's embedding into the shared sum)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

from .conftest import save_tiny_model

PROMPTS = [[5, 6, 7, 8, 9], [100, 3], [(7 * i) % 250 + 3 for i in range(40)]]


def _reference_logprobs(ref: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = ref(ids).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("kv_heads,vocab", [(2, 256), (1, 255)], ids=["split", "replicated"])
def test_tp2_matches_transformers(tmp_path: Path, kv_heads: int, vocab: int) -> None:
    ref = save_tiny_model(tmp_path, num_key_value_heads=kv_heads, vocab_size=vocab)
    llm = LLM(tmp_path, tp=2, device="cpu", kv_tokens=1024, page_size=2)
    try:
        greedy = llm.generate(PROMPTS, SamplingParams(max_new_tokens=12, ignore_eos=True))
        llm.drop_prefix_cache()  # on every rank: a rank that kept its cache would run apart
        sampled = llm.generate(PROMPTS, SamplingParams(
            temperature=1.0, max_new_tokens=12, ignore_eos=True, logprobs=True))
    finally:
        llm.shutdown()
    for prompt, res in zip(PROMPTS, greedy):
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                               do_sample=False)
        assert res["token_ids"] == out[0, len(prompt):].tolist()
    for prompt, res in zip(PROMPTS, sampled):
        assert res["cached_tokens"] == 0
        want = _reference_logprobs(ref, prompt, res["token_ids"])
        torch.testing.assert_close(res["logprobs"], want, atol=1e-3, rtol=1e-3)
