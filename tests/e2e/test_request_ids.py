"""`x-request-id` and `--log-requests` (router/src/api/access.rs) on the real server: the
shared router runs with --log-requests, so its log has one line per request, written once
the response was sent or its client went away."""

import re
import time

import requests

from tests.e2e.conftest import Server

MODEL = "SmolLM2-135M-Instruct"


def log_line(server: Server, request_id: str, timeout_s: float = 10) -> str:
    """The access line of `request_id`, once the router has written it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in server.log_path.read_text(errors="replace").splitlines():
            if f"request {request_id}: " in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no line for {request_id}:\n{server.log_tail()}")


def test_the_clients_id_comes_back_and_names_the_log_line(server: Server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, "temperature": 0}
    resp = requests.post(f"{server.base_url}/v1/chat/completions", json=body,
                         headers={"x-request-id": "e2e-whole-1"}, timeout=120)
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "e2e-whole-1"
    line = log_line(server, "e2e-whole-1")
    assert re.search(r"POST /v1/chat/completions 200, head [\d.]+ ms, sent [\d.]+ ms$", line), line


def test_without_an_id_the_router_makes_one_up(server: Server) -> None:
    resp = requests.get(f"{server.base_url}/v1/models", timeout=30)
    made_up = resp.headers["x-request-id"]
    assert re.fullmatch(r"req-[0-9a-f]{16}", made_up), made_up
    assert "GET /v1/models 200" in log_line(server, made_up)


def test_a_stream_the_client_leaves_is_logged_as_gone(server: Server) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
            "temperature": 0, "ignore_eos": True}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True,
                       headers={"x-request-id": "e2e-left-1"}, timeout=120) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())  # the first event, then hang up
    line = log_line(server, "e2e-left-1", timeout_s=60)
    assert re.search(r"POST /v1/completions 200, head [\d.]+ ms, client gone after", line), line


def test_a_bad_id_is_refused_naming_the_header(server: Server) -> None:
    resp = requests.get(f"{server.base_url}/v1/models", headers={"x-request-id": "a b"},
                        timeout=30)
    assert resp.status_code == 400
    assert "`x-request-id`" in resp.json()["error"]["message"]
    assert "x-request-id" not in resp.headers  # no id to name it by
    assert "GET /v1/models 400" in log_line(server, "(a bad x-request-id)")
