"""Overload: four times the in-flight limit (`--max-requests`) sent at once. The excess is
refused at once with 429 and `Retry-After` (OpenAI's error shape), and every admitted request
completes in full: all its tokens, `finish_reason: "length"`, streamed or not; afterwards
nothing is in flight and no KV is held."""

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.e2e.conftest import Server, start_router, stop_router, wait_idle

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LIMIT = 4
SENT = 4 * LIMIT
TOKENS = 24  # long enough on CPU that the admitted ones are still running as the rest arrive


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("overload"), "--max-requests", str(LIMIT))
    yield server
    stop_router(server)


def completion(server: Server, i: int, start: threading.Barrier) -> tuple[int, dict]:
    """One request (odd `i`: streamed): its status and what it answered (for a stream: the
    finish reason and usage of its chunks)."""
    body = {"model": MODEL, "prompt": f"Item {i}: a list of fruits", "max_tokens": TOKENS,
            "ignore_eos": True, "stream": i % 2 == 1,
            "stream_options": {"include_usage": True} if i % 2 else None}
    start.wait()
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True,
                       timeout=300) as r:
        if r.status_code != 200 or not body["stream"]:
            answer = r.json()
            if r.status_code == 429:
                answer["retry_after"] = r.headers.get("Retry-After")
            return r.status_code, answer
        chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: ") and line != "data: [DONE]"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    return 200, {"choices": [{"finish_reason": finishes[-1]}], "usage": usage,
                 "text_chunks": sum(1 for c in chunks if c["choices"])}


def test_four_times_the_limit_at_once(limited: Server) -> None:
    wait_idle(limited.base_url, timeout_s=60)
    start = threading.Barrier(SENT)
    with ThreadPoolExecutor(SENT) as pool:
        answers = list(pool.map(lambda i: completion(limited, i, start), range(SENT)))
    admitted = [a for status, a in answers if status == 200]
    refused = [a for status, a in answers if status == 429]
    print(f"overload: {SENT} sent at once, limit {LIMIT}: {len(admitted)} admitted, "
          f"{len(refused)} refused with 429")
    assert len(admitted) + len(refused) == SENT, answers
    assert LIMIT <= len(admitted) < SENT and refused, answers
    for a in refused:
        assert a["retry_after"] == "1", a
        assert a["error"]["type"] == "rate_limit_exceeded", a
        assert f"(limit {LIMIT})" in a["error"]["message"], a
    for a in admitted:
        assert a["choices"][0]["finish_reason"] == "length", a
        assert a["usage"]["completion_tokens"] == TOKENS, a
    assert wait_idle(limited.base_url, timeout_s=60)["kv_cache_used_tokens"] == 0
