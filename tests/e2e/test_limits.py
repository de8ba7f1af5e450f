"""Against the real worker: `--request-timeout` (a request that cannot finish in time gets 504,
an error event when streaming, in about that time, and the worker frees its KV), and the
model names a `--model PATH` server accepts (the path as given and the folder's name)."""

import json
import time
from collections.abc import Iterator

import pytest
import requests
from minisgl_worker.default_model import ensure_default_model

from tests.e2e.conftest import Server, metric, start_router, stop_router, wait_idle

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TIMEOUT_S = 6.0  # the first token must come before it, on a loaded 2-core CI machine too
# Thousands of tokens: minutes on CPU, far past the timeout.
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": 4000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("limits"), "--model", ensure_default_model(),
                          "--request-timeout", str(TIMEOUT_S))
    yield server
    stop_router(server)


def post(server: Server, body: dict, stream: bool = False) -> requests.Response:
    return requests.post(f"{server.base_url}/v1/chat/completions", json=body, stream=stream,
                         timeout=120)


def timeouts(server: Server) -> float:
    text = requests.get(f"{server.base_url}/metrics", timeout=10).text
    return metric(text, "minisgl_request_timeouts_total")


def test_a_request_past_the_timeout_gets_504_and_its_kv_is_freed(timed: Server) -> None:
    before = timeouts(timed)
    started = time.monotonic()
    r = post(timed, LONG)
    took = time.monotonic() - started
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["type"] == "timeout" and "--request-timeout" in error["message"], error
    assert TIMEOUT_S <= took < TIMEOUT_S + 15, took
    wait_idle(timed.base_url, timeout_s=10)
    assert timeouts(timed) == before + 1


def test_a_stream_past_the_timeout_ends_with_an_error_event(timed: Server) -> None:
    before = timeouts(timed)
    started = time.monotonic()
    with post(timed, {**LONG, "stream": True}, stream=True) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: ")]
    took = time.monotonic() - started
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "timeout", error
    assert any(json.loads(e).get("choices") for e in events[:-2])  # tokens came first
    assert TIMEOUT_S <= took < TIMEOUT_S + 15, took
    wait_idle(timed.base_url, timeout_s=10)
    assert timeouts(timed) == before + 1


def test_the_model_path_as_given_and_the_folder_name_are_served(timed: Server) -> None:
    path = ensure_default_model()
    listed = requests.get(f"{timed.base_url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in listed] == [MODEL, path]
    for name in (MODEL, path):  # /tokenize checks `model` as generation does (echo: Rust tests)
        r = requests.post(f"{timed.base_url}/tokenize", json={"model": name, "prompt": "hi"},
                          timeout=10)
        assert r.status_code == 200, r.text
    r = requests.post(f"{timed.base_url}/v1/completions", json={"model": "x", "prompt": "p"},
                      timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        f"The model `x` does not exist; this server serves `{MODEL}`, `{path}`")
