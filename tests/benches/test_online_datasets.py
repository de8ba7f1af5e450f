"""benches/online/online_datasets.py, benches/online/online.py's schedule and benches/online/random_model.py:
seeded, exact-length request sets, and a model folder both servers tokenize alike."""

import json
import math
import random
from pathlib import Path

import numpy as np
import online_datasets as ds
import pytest
from online import schedule
from random_model import write_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def words_tok():
    from random_model import word_tokenizer

    return word_tokenizer(500)


def test_random_ids_are_exact_lengths_in_range_and_seeded(words_tok) -> None:
    maker = lambda seed: ds.PromptMaker(words_tok, "ids", random.Random(seed))
    reqs = ds.random_set(maker(0), 50, input_len=100, output_len=20, ratio=0.5)
    for r in reqs:
        assert 50 <= r.prompt_len <= 150 and 10 <= r.output_len <= 30
        assert len(words_tok.encode(r.text, add_special_tokens=False).ids) == r.prompt_len
    assert len({r.prompt_len for r in reqs}) > 10
    again = ds.random_set(maker(0), 50, input_len=100, output_len=20, ratio=0.5)
    other = ds.random_set(maker(1), 50, input_len=100, output_len=20, ratio=0.5)
    assert ds.fingerprint(reqs) == ds.fingerprint(again) != ds.fingerprint(other)


def test_range_ratio_zero_is_fixed_lengths_and_bad_ratios_are_refused(words_tok) -> None:
    maker = ds.PromptMaker(words_tok, "ids", random.Random(0))
    assert {(r.prompt_len, r.output_len) for r in ds.random_set(maker, 5, 64, 8, 0.0)} == {(64, 8)}
    with pytest.raises(ValueError, match=r"--range-ratio must be in \[0, 1\); got 1.5"):
        ds.random_set(maker, 5, 64, 8, 1.5)


def test_words_without_a_tokenizer_count_a_word_as_a_token() -> None:
    maker = ds.PromptMaker(None, "words", random.Random(0))
    text, count = maker.make(37)
    assert count == 37 == len(text.split()) and set(text.split()) <= set(ds.WORDS)
    with pytest.raises(ValueError, match="--prompt-kind ids needs --tokenizer"):
        ds.PromptMaker(None, "ids", random.Random(0))


def test_shared_prefix_groups_share_their_system_prompt(words_tok) -> None:
    maker = ds.PromptMaker(words_tok, "ids", random.Random(0))
    reqs = ds.shared_prefix_set(maker, 24, groups=3, system_len=40, question_len=10,
                                output_len=5)
    systems = [r.messages[0]["content"] for r in reqs]
    assert len(set(systems)) == 3 and all(systems.count(s) == 8 for s in set(systems))
    assert {r.prompt_len for r in reqs} == {50}
    assert [r.messages[0]["role"] for r in reqs[:1]] == ["system"]
    assert len({r.messages[1]["content"] for r in reqs}) == 24


def test_sharegpt_lengths_are_log_normal_and_clipped(words_tok) -> None:
    maker = ds.PromptMaker(words_tok, "ids", random.Random(0))
    reqs = ds.sharegpt_set(maker, 400, seed=0, in_median=60, in_sigma=1.0, out_median=30,
                           out_sigma=0.8, in_max=300, out_max=100)
    ins = [r.prompt_len for r in reqs]
    outs = [r.output_len for r in reqs]
    assert min(ins) >= 4 and max(ins) <= 300 and max(outs) <= 100
    assert 45 <= np.median(ins) <= 75 and 22 <= np.median(outs) <= 38
    assert max(ins) > 4 * np.median(ins)  # a long tail


def test_poisson_schedule_is_seeded_with_the_rate_as_its_mean() -> None:
    offsets = schedule(50.0, 4000, seed=3)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets == schedule(50.0, 4000, seed=3) != schedule(50.0, 4000, seed=4)
    assert np.mean(np.diff(offsets)) == pytest.approx(1 / 50, rel=0.05)
    assert schedule(math.inf, 3, seed=0) == [0.0, 0.0, 0.0]


def test_random_model_folder_tokenizes_alike_for_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    out = write_model(ROOT / "benches/models/qwen3-0.6b", tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == config["vocab_size"] == 151936
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w151935"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "w1 w2 w3 w151935" == ds.Request(messages, 4, 1).text
    assert tok.encode(text) == [1, 2, 3, 151935]  # no special tokens added
    assert tok.decode([7, 8]) == "w7 w8"
    assert tok.eos_token == f"w{config['eos_token_id']}"
