"""The official `openai` client against a real router + worker serving the default model."""

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from tests.e2e.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def chat_stream_text(server: Server, messages: list[dict], max_tokens: int = 32) -> str:
    chunks = server.client().chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_health_and_models(server: Server) -> None:
    assert requests.get(f"{server.base_url}/health").status_code == 200
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert server.client().models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("gpt-4")


def test_chat_answers_the_capital_of_france(server: Server) -> None:
    resp = server.client().chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=32
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"
    assert resp.object == "chat.completion" and resp.model == MODEL and resp.id
    usage = resp.usage
    assert usage is not None and usage.prompt_tokens > 10
    # The answer's tokens plus the <|im_end|> that ended it.
    assert usage.completion_tokens >= 7
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_developer_message_is_the_templates_system_message(server: Server) -> None:
    """OpenAI's newer clients send instructions as `developer`; the default model's
    template has no such role, so it renders them as `system`: same prompt, same answer."""
    def ask(role: str):  # type: ignore[no-untyped-def]
        return server.client().chat.completions.create(
            model=MODEL, temperature=0, max_tokens=16,
            messages=[{"role": role, "content": "Answer in French."}, *FRANCE])
    developer, system = ask("developer"), ask("system")
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    assert developer.choices[0].message.content == system.choices[0].message.content


def test_chat_stream_equals_non_stream(server: Server) -> None:
    client = server.client()
    whole = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=32
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=FRANCE,
            temperature=0,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_respect_max_tokens(server: Server) -> None:
    resp = server.client().completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    choice = resp.choices[0]
    assert resp.object == "text_completion"
    assert choice.finish_reason == "length"
    assert choice.text.strip()
    assert resp.usage.completion_tokens == 8
    assert resp.usage.prompt_tokens == 5


def test_eight_concurrent_streams_match_their_solo_texts(server: Server) -> None:
    questions = [
        "What is the capital of France?",
        "Name three primary colors.",
        "What is 2 + 2?",
        "Write a haiku about the sea.",
        "Who wrote Romeo and Juliet?",
        "What is the boiling point of water?",
        "Give me a synonym for happy.",
        "What color is the sky?",
    ]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    alone = [chat_stream_text(server, c) for c in conversations]
    with ThreadPoolExecutor(len(conversations)) as pool:
        together = list(pool.map(lambda c: chat_stream_text(server, c), conversations))
    assert all(alone), alone
    assert together == alone
