"""Fuzzing every route of a real router (default model, CPU) with malformed and edge-case
requests drawn by Hypothesis: valid bodies with fields replaced by any JSON (wrong types,
huge and negative numbers, NaN and Infinity, empty and long strings, deep nesting), unknown
and missing fields, invalid UTF-8, truncated bodies, wrong content types and methods,
bodies past the size limit. Every answer must be below 500 (4xx in OpenAI's error shape),
the router and its worker must survive, and a normal request must then be answered right.

MINISGL_FUZZ_COUNT sets the number of requests (default 2,000). Hypothesis draws them all
first, then CLIENTS threads send them at once: the valid ones among them (a few tokens each,
under a small `--max-tokens-limit`) are batched by the worker instead of each paying its own
steps, which is what makes thousands affordable on a 2-core CPU machine; concurrency also
fuzzes the router's admission and batching paths, not just its parsing."""

import http.client
import json
import os
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import Server, start_router, stop_router, wait_idle

pytestmark = pytest.mark.slow

COUNT = int(os.environ.get("MINISGL_FUZZ_COUNT", "2000"))
CLIENTS = 16  # concurrent senders (the router's --max-requests is far above it)
MAX_BODY = 4 << 20  # the router's body limit
MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# A valid body per route: the fuzzer mutates these (None: a GET without a body).
ROUTES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("POST", "/v1/chat/completions"): {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
    ("POST", "/v1/completions"): {"model": MODEL, "prompt": "Paris is", "max_tokens": 2},
    ("POST", "/tokenize"): {"prompt": "hi"},
    ("POST", "/detokenize"): {"tokens": [42, 43]},
    ("POST", "/generate"): {"text": "Paris is", "sampling_params": {"max_new_tokens": 2}},
    ("GET", "/v1/models"): None,
    ("GET", "/health"): None,
    ("GET", "/metrics"): None,
    ("GET", "/openapi.json"): None,
    ("GET", "/"): None,
    ("GET", "/no-such-route"): None,
    ("DELETE", "/v1/chat/completions"): None,
}
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "top_k", "min_p", "n", "stop", "stop_token_ids", "seed", "stream",
          "stream_options", "logprobs", "top_logprobs", "logit_bias", "echo", "ignore_eos",
          "min_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "user",
          "tokens", "text", "input_ids", "sampling_params", "add_special_tokens", "unknown_x"]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain",
                 "application/x-www-form-urlencoded", "APPLICATION/JSON", None]
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**32, 2**63, -(2**63), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\u0000", "\ud7ff" * 3]),
                 st.integers(0, 20_000).map(lambda n: "x" * n))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda children: st.one_of(st.lists(children, max_size=6),
                               st.dictionaries(st.sampled_from(FIELDS + ["role", "content"]),
                                               children, max_size=4)),
    max_leaves=12,
)


def encode(body: Any) -> bytes:
    """JSON as Python writes it: NaN and Infinity come out as bare words (invalid JSON)."""
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def mutated_body(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    body = dict(base)
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["set", "set", "drop", "stream"]))
        field = draw(st.sampled_from(FIELDS))
        if action == "set":
            body[field] = draw(JSON)
        elif action == "drop":
            body.pop(field, None)
        else:
            body["stream"] = True
    return encode(body)


@st.composite
def fuzz_request(draw: st.DrawFn) -> tuple[str, str, bytes | None, str | None]:
    method, path = draw(st.sampled_from(sorted(ROUTES)))
    base = ROUTES[(method, path)]
    content_type = "application/json" if draw(st.integers(0, 4)) else draw(
        st.sampled_from(CONTENT_TYPES))
    kind = draw(st.integers(0, 99))
    if base is None and kind < 80:
        return method, path, None, None
    valid = encode(base or {"model": MODEL})
    if kind < 60:
        body = draw(mutated_body(base or {}))
    elif kind < 70:
        body = draw(st.binary(max_size=200))  # invalid UTF-8, not JSON
    elif kind < 80:
        body = valid[: draw(st.integers(0, max(len(valid) - 1, 0)))]  # truncated
    elif kind < 88:
        depth = draw(st.sampled_from([10, 127, 129, 1000, 100_000]))
        body = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    elif kind < 95:
        body = encode(draw(JSON))  # any JSON, an object or not
    elif kind < 98:
        body = draw(st.text(alphabet=string.printable, max_size=100)).encode()
    else:
        body = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'  # past the 4 MiB limit
    return method, path, body, content_type


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Small limits keep the valid requests among the fuzz cheap on CPU.
    server = start_router(tmp_path_factory.mktemp("fuzz"), "--max-tokens-limit", "4",
                          "--max-n", "4", "--max-prompts", "8")
    yield server
    stop_router(server)


def send(server: Server, method: str, path: str, body: bytes | None,
         content_type: str | None) -> tuple[int, bytes]:
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        try:
            conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # The router answers a body past its limit (413) before reading it all.
            assert body is not None and len(body) > MAX_BODY, "connection dropped"
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


Request = tuple[str, str, bytes | None, str | None]


def draw_requests(count: int) -> list[Request]:
    """`count` requests drawn by Hypothesis (generation only: nothing is sent yet)."""
    drawn: list[Request] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(fuzz_request())
    def collect(request: Request) -> None:
        drawn.append(request)

    collect()
    return drawn


def test_fuzzed_requests_never_get_a_5xx(fuzzed: Server) -> None:
    drawn = draw_requests(COUNT)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda r: send(fuzzed, *r), drawn))
    statuses: dict[int, int] = {}
    for request, (status, payload) in zip(drawn, answers, strict=True):
        statuses[status] = statuses.get(status, 0) + 1
        body = request[2] or b""
        assert status < 500, (request[:2], body[:300], payload[:300])
        if status >= 400:
            assert json.loads(payload)["error"]["message"], (request[:2], payload[:300])
    print(f"fuzz: {len(answers)} requests, statuses {dict(sorted(statuses.items()))}")
    assert fuzzed.proc.poll() is None, fuzzed.log_tail()
    wait_idle(fuzzed.base_url, timeout_s=60)
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 4}
    r = requests.post(f"{fuzzed.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert content and "The capital of France is Paris.".startswith(content), content
    assert requests.get(f"{fuzzed.base_url}/health", timeout=10).status_code == 200
