"""The offline API end to end on the tiny model, against transformers' greedy generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [100, 3], [(7 * i) % 250 + 3 for i in range(40)]]


@pytest.fixture
def llm(tiny_llama: tuple[Path, Any]) -> Any:
    llm = LLM(tiny_llama[0], device="cpu", kv_tokens=1024, page_size=2)
    yield llm
    llm.shutdown()


def test_greedy_matches_transformers_generate(llm: LLM, tiny_llama: tuple[Path, Any]) -> None:
    ref = tiny_llama[1]
    results = llm.generate(PROMPTS, SamplingParams(max_new_tokens=16, min_new_tokens=16))
    for prompt, res in zip(PROMPTS, results):
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16,
                               do_sample=False)
        assert res["token_ids"] == out[0, len(prompt):].tolist()
        assert res["finish_reason"] == "length" and "text" not in res


def test_eos_ends_a_request_with_stop(llm: LLM) -> None:
    free = llm.generate(PROMPTS, SamplingParams(max_new_tokens=16, ignore_eos=True))
    eos = free[2]["token_ids"][3]  # pretend this token were EOS: stop ids behave the same
    res = llm.generate(PROMPTS[2:], SamplingParams(max_new_tokens=16, stop_token_ids=[eos]))
    assert res[0]["token_ids"][-1] == eos and res[0]["finish_reason"] == "stop"


def test_logprobs_come_back_per_token(llm: LLM) -> None:
    sp = SamplingParams(max_new_tokens=4, logprobs=True, top_logprobs=2, ignore_eos=True)
    (res,) = llm.generate(PROMPTS[:1], sp)
    assert len(res["logprobs"]) == 4 and all(lp <= 0 for lp in res["logprobs"])
    assert all(top[0][0] == t for top, t in zip(res["top_logprobs"], res["token_ids"]))


def test_text_prompts_use_the_folders_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from .conftest import save_tiny_model

    save_tiny_model(tmp_path)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(253))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    assert json.loads((tmp_path / "tokenizer.json").read_text())
    llm = LLM(tmp_path, device="cpu", kv_tokens=256)
    try:
        (res,) = llm.generate(["w1 w2 w3"], SamplingParams(max_new_tokens=3, ignore_eos=True))
        ids = llm.generate([[4, 5, 6]], SamplingParams(max_new_tokens=3, ignore_eos=True))
        assert res["token_ids"] == ids[0]["token_ids"]
        assert res["text"].split() == [tok.id_to_token(t) for t in res["token_ids"]]
    finally:
        llm.shutdown()


def test_a_prompt_that_cannot_fit_raises_and_leaves_nothing_behind(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_context"):
        llm.generate([[5, 6], list(range(3, 250)) * 5], SamplingParams(max_new_tokens=2))
    assert not llm.scheduler.has_work
    assert llm.generate([[5, 6]], SamplingParams(max_new_tokens=2))[0]["token_ids"]
