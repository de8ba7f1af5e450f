"""The radix prefix cache seen through the HTTP API: a long shared system prompt is computed
once and reported as cached (`usage.prompt_tokens_details.cached_tokens`), and concurrent
requests that share it give the same greedy texts as alone."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import Server, start_router, stop_router

MODEL = "SmolLM2-135M-Instruct"
COLORS = ["red", "green", "blue", "amber", "violet", "silver", "black"]
ANIMALS = ["fox", "owl", "otter", "heron", "badger", "lynx", "crane", "hare", "wolf"]
SYSTEM = "You are a careful assistant for a farm. Remember these rules.\n" + "\n".join(
    f"Rule {i}: the {COLORS[i % 7]} {ANIMALS[i % 9]} sleeps in barn {i * 7 % 13}."
    for i in range(70)
)


def ask(server: Server, question: str, max_tokens: int = 12) -> tuple[str, int, int]:
    """(text, prompt tokens, cached prompt tokens) of a greedy chat completion."""
    resp = server.client().chat.completions.create(
        model=MODEL, temperature=0, max_tokens=max_tokens,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    )
    usage = resp.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return resp.choices[0].message.content or "", usage.prompt_tokens, cached


def test_a_shared_1000_token_prefix_is_reported_cached(server: Server) -> None:
    _, prompt_tokens, _ = ask(server, "Where does the red fox sleep?")
    assert prompt_tokens >= 1000
    _, second_tokens, cached = ask(server, "Which animal sleeps in barn 3?")
    print(f"second request: {second_tokens} prompt tokens, {cached} cached")
    assert cached >= 900 and cached < second_tokens


def test_sixteen_concurrent_requests_match_their_solo_texts(server: Server) -> None:
    questions = [f"Where does the {c} {a} sleep?" for c, a in zip(COLORS * 3, ANIMALS * 2)][:16]
    alone = [ask(server, q)[0] for q in questions]
    with ThreadPoolExecutor(len(questions)) as pool:
        together = list(pool.map(lambda q: ask(server, q), questions))
    assert all(alone), alone
    assert [t for t, _, _ in together] == alone
    assert all(cached >= 900 for _, _, cached in together)  # the system prompt, shared


def test_router_cache_naive_reaches_the_worker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`minisgl-router --cache naive --chunk-size 256 --mixed-chunk-size 64
    --mixed-step-tokens 128 --schedule-policy lof`: the spawned worker gets every flag (its
    log says so) and caches nothing: the second request computes the whole prefix."""
    server = start_router(tmp_path_factory.mktemp("naive"), "--cache", "naive",
                          "--chunk-size", "256", "--mixed-chunk-size", "64",
                          "--mixed-step-tokens", "128", "--schedule-policy", "lof")
    try:
        first, _, _ = ask(server, "Where does the red fox sleep?")
        _, second_tokens, cached = ask(server, "Which animal sleeps in barn 3?")
        assert second_tokens >= 1000 and cached == 0
        log = server.log_path.read_text()
        assert "cache naive, chunk 256 (64 beside decodes, steps of 128 from 32 decodes), lof" \
            in log
        assert first
    finally:
        stop_router(server)
