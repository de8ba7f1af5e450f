"""Every request parameter of issue 5 through the official `openai` client, against the real
router and the default model on CPU. Each test checks an effect the parameter must have.
Parameters the client has no keyword for (top_k, min_p, min_tokens, ...) go in `extra_body`.
"""

from itertools import accumulate
from typing import Any

import openai
import pytest
import requests

from tests.e2e.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."
REPEAT = "one one one one one one one one"


def chat(server: Server, **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 24)
    return server.client().chat.completions.create(model=MODEL, messages=FRANCE, **kwargs)


def complete(server: Server, prompt: Any = REPEAT, **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 8)
    return server.client().completions.create(model=MODEL, prompt=prompt, **kwargs)


def token_ids(server: Server, text: str) -> list[int]:
    resp = requests.post(f"{server.base_url}/tokenize", json={"prompt": text})
    return list(resp.json()["tokens"])


def test_model_must_be_served(server: Server) -> None:
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-4", messages=FRANCE)


def test_messages_take_strings_parts_and_a_system_role(server: Server) -> None:
    one = [{"type": "text", "text": "What is the capital of France?"}]
    resp = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": one}], temperature=0, max_tokens=24
    )
    assert resp.choices[0].message.content == ANSWER
    # Several text parts are joined by newlines (as vLLM joins them).
    two = [{"type": "text", "text": "Be brief."}, *one]
    resp = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": two}], max_tokens=1)
    def count(text: str) -> int:
        body = {"messages": [{"role": "user", "content": text}]}
        return requests.post(f"{server.base_url}/tokenize", json=body).json()["count"]
    question = "What is the capital of France?"
    joined, glued = count(f"Be brief.\n{question}"), count(f"Be brief.{question}")
    assert resp.usage.prompt_tokens == joined != glued
    # A system message replaces the template's default one: the prompt is what /tokenize
    # renders for the same messages.
    system = [{"role": "system", "content": "Answer in one word."}, *FRANCE]
    resp = server.client().chat.completions.create(model=MODEL, messages=system, max_tokens=1)
    rendered = requests.post(f"{server.base_url}/tokenize", json={"messages": system})
    assert resp.usage.prompt_tokens == rendered.json()["count"]
    default = chat(server, max_tokens=1).usage.prompt_tokens
    assert resp.usage.prompt_tokens != default


def test_max_tokens_and_max_completion_tokens(server: Server) -> None:
    resp = chat(server, temperature=0, max_tokens=3)
    assert resp.usage.completion_tokens == 3 and resp.choices[0].finish_reason == "length"
    resp = chat(server, temperature=0, max_tokens=None, max_completion_tokens=4)
    assert resp.usage.completion_tokens == 4 and resp.choices[0].finish_reason == "length"
    # Completions without max_tokens stop at 16, as OpenAI's and vLLM's do.
    resp = complete(server, max_tokens=None, extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 16 and resp.choices[0].finish_reason == "length"


def test_temperature_zero_is_deterministic(server: Server) -> None:
    texts = {chat(server, temperature=0).choices[0].message.content for _ in range(2)}
    assert texts == {ANSWER}


def test_seed_reproduces_and_different_seeds_differ(server: Server) -> None:
    def text(seed: int) -> str:
        return str(
            complete(server, "Once upon a time", temperature=1.5, seed=seed, max_tokens=12)
            .choices[0]
            .text
        )

    assert text(1) == text(1)
    assert len({text(1), text(2), text(3)}) > 1


def test_top_k_1_top_p_tiny_and_min_p_high_equal_greedy(server: Server) -> None:
    greedy = complete(server, "Once upon a time", temperature=0).choices[0].text
    for extra in ({"top_k": 1}, {"min_p": 0.999}):
        resp = complete(server, "Once upon a time", temperature=1.5, seed=7, extra_body=extra)
        assert resp.choices[0].text == greedy, extra
    resp = complete(server, "Once upon a time", temperature=1.5, seed=7, top_p=1e-6)
    assert resp.choices[0].text == greedy


def test_n_gives_n_choices_that_differ_when_sampled(server: Server) -> None:
    resp = chat(server, n=2, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1]
    assert {c.message.content for c in resp.choices} == {ANSWER}
    resp = complete(server, "Once upon a time", n=3, temperature=1.5, seed=3, max_tokens=12)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len({c.text for c in resp.choices}) > 1, "copies use seed, seed+1, seed+2"


def test_prompt_lists_of_strings_and_token_ids(server: Server) -> None:
    prompts = ["The capital of France is", "One, two,"]
    resp = complete(server, prompts, n=2, temperature=0, max_tokens=4)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    texts = [c.text for c in resp.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]
    ids = [token_ids(server, p) for p in prompts]
    by_ids = complete(server, ids, temperature=0, max_tokens=4)
    assert [c.text for c in by_ids.choices] == [texts[0], texts[2]]
    assert resp.usage.prompt_tokens == sum(len(i) for i in ids)


def test_stop_strings_cut_the_text(server: Server) -> None:
    resp = chat(server, temperature=0, stop=[" Paris", "zzz"])
    assert resp.choices[0].message.content == "The capital of France is"
    assert resp.choices[0].finish_reason == "stop"


def test_stop_token_ids_end_with_stop(server: Server) -> None:
    capital = token_ids(server, "The capital")[-1]
    resp = chat(server, temperature=0, extra_body={"stop_token_ids": [capital]})
    assert resp.choices[0].message.content == "The"
    assert resp.choices[0].finish_reason == "stop"


def test_ignore_eos_runs_to_the_length_limit(server: Server) -> None:
    resp = chat(server, temperature=0, max_tokens=20, extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 20 and resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content.startswith(ANSWER)


def test_min_tokens_prevents_an_early_stop(server: Server) -> None:
    resp = chat(server, temperature=0, max_tokens=20, extra_body={"min_tokens": 14})
    assert resp.usage.completion_tokens >= 14
    assert resp.choices[0].message.content.startswith(ANSWER)


def test_penalties_change_the_output(server: Server) -> None:
    # Reported logprobs come from the penalized logits, so a penalty shows even where the
    # argmax survives it.
    def run(**kwargs: Any) -> tuple[str, list[float]]:
        choice = complete(server, temperature=0, max_tokens=8, logprobs=0, **kwargs).choices[0]
        return choice.text, choice.logprobs.token_logprobs

    plain = run()
    for extra in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ):
        assert run(**extra) != plain, extra


def test_logit_bias_forces_a_token(server: Server) -> None:
    bang = token_ids(server, "!")[-1]
    resp = complete(server, "Hello", temperature=0, max_tokens=4, logit_bias={str(bang): 100})
    assert resp.choices[0].text == "!!!!"
    resp = chat(server, temperature=0, logit_bias={str(token_ids(server, "The")[0]): -100})
    assert not resp.choices[0].message.content.startswith("The")


def test_chat_logprobs_and_top_logprobs(server: Server) -> None:
    resp = chat(server, temperature=0, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert "".join(c.token for c in content) == ANSWER
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 3
        assert c.top_logprobs[0].logprob >= c.top_logprobs[-1].logprob
        assert bytes(c.bytes).decode() == c.token


def test_completion_logprobs_and_echo(server: Server) -> None:
    resp = complete(server, "The capital of France is", temperature=0, max_tokens=3, logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(t) == 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    echoed = complete(
        server, "The capital of France is", temperature=0, max_tokens=3, logprobs=2, echo=True
    )
    text = echoed.choices[0].text
    assert text == "The capital of France is" + resp.choices[0].text
    elp = echoed.choices[0].logprobs
    assert elp.token_logprobs[0] is None  # prompt tokens are not scored
    assert elp.token_logprobs[-3:] == lp.token_logprobs


def test_text_offsets_count_characters(server: Server) -> None:
    # Each token starts where the ones before it end, in characters (as vLLM counts), not
    # UTF-8 bytes: "é" and "日本" are one character each and two or three bytes.
    resp = complete(server, "Café au lait, 日本", temperature=0, max_tokens=2, logprobs=0,
                    echo=True)
    lp = resp.choices[0].logprobs
    assert any(len(t.encode()) > len(t) for t in lp.tokens), lp.tokens  # some multi-byte
    assert lp.text_offset == list(accumulate([0] + [len(t) for t in lp.tokens[:-1]]))


def test_stream_with_include_usage(server: Server) -> None:
    chunks = list(
        chat(server, temperature=0, stream=True, stream_options={"include_usage": True}, user="e2e")
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 7
    assert all(c.usage is None for c in chunks[:-1])
