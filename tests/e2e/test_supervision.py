"""Local workers that die: `kill -9` of a worker ends its streams with an error at once, the
router restarts it, and a request that had no token yet is sent again to a ready worker."""

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import Server, start_router, stop_router
from tests.e2e.test_workers import shared_prefix_requests

MODEL = "SmolLM2-135M-Instruct"


def worker_pid(server: Server, index: int) -> int:
    """The pid of local worker `index` (its launcher sets MINISGL_WORKER_INDEX)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == server.proc.pid and f"MINISGL_WORKER_INDEX={index}".encode() in env:
            return int(entry.name)
    raise AssertionError(f"no worker {index} under the router:\n{server.log_tail()}")


def health(server: Server) -> dict:
    return requests.get(f"{server.base_url}/health", timeout=10).json()


def wait_until(what, within_s: float, server: Server):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {within_s} s:\n{server.log_tail()}")


def restarts(server: Server) -> list[int]:
    text = requests.get(f"{server.base_url}/metrics", timeout=10).text
    return [
        int(n)
        for n in re.findall(r"^minisgl_worker_restarts_total\{.*\} (\d+)$", text, re.MULTILINE)
    ]


def complete(server: Server, prompt: str, max_tokens: int = 8) -> requests.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("one-worker"))
    yield server
    stop_router(server)


def test_a_killed_worker_ends_its_stream_with_an_error_and_comes_back(one_worker: Server) -> None:
    before = complete(one_worker, "The capital of France is")
    assert before.status_code == 200, before.text
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(
        f"{one_worker.base_url}/v1/completions", json=body, stream=True, timeout=60
    ) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith(b"data: {"))  # streaming
        os.kill(worker_pid(one_worker, 0), signal.SIGKILL)
        killed = time.monotonic()
        events = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
        ended = time.monotonic() - killed
    assert ended < 2.0, ended
    assert "error" in events[-1], events[-1]
    assert events[-1]["error"]["code"] == "service_unavailable"
    message = events[-1]["error"]["message"]
    assert "exited" in message or "disconnected" in message, message
    # Down at once (a 503 with Retry-After), then back after its backoff and reload.
    refused = complete(one_worker, "The capital of France is")
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    assert health(one_worker)["workers"][0]["status"] in ("down", "ready")
    wait_until(lambda: health(one_worker)["status"] == "ok", 120, one_worker)
    again = complete(one_worker, "The capital of France is")
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
    assert restarts(one_worker) == [1]
    assert health(one_worker)["workers"][0]["restarts"] == 1
    assert "restart 1 in 1 s" in one_worker.log_path.read_text()


def test_two_workers_survive_a_kill_and_the_request_without_tokens_is_retried(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    server = start_router(
        tmp_path_factory.mktemp("two-kill"), "--workers", "2", "--routing-policy", "round_robin"
    )
    try:
        delta, sent = shared_prefix_requests(server, "roundrobin")
        assert min(delta) > 0.4 * sent, delta  # two requests each
        # Worker 0 is frozen, so its request has no token yet when it is killed.
        victim = worker_pid(server, 0)
        os.kill(victim, signal.SIGSTOP)
        prompts = [f"Question {i}: the capital of France is" for i in range(6)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            pending = [pool.submit(complete, server, p) for p in prompts]
            wait_until(lambda: health(server)["workers"][0]["in_flight"] > 0, 30, server)
            os.kill(victim, signal.SIGKILL)
            answers = [f.result() for f in pending]
        assert [a.status_code for a in answers] == [200] * len(prompts), [a.text for a in answers]
        retried = requests.get(f"{server.base_url}/metrics", timeout=10).text
        assert re.search(r"^minisgl_request_retries_total [1-9]", retried, re.MULTILINE), retried
        log = server.log_path.read_text()  # the retry's warning names its request
        assert re.search(r"request\{id=req-[0-9a-f]{16}\}: .*retrying a request", log), log[-3000:]
        wait_until(lambda: health(server)["status"] == "ok", 120, server)
        assert restarts(server) == [1, 0]
        assert complete(server, "Water boils at").status_code == 200
    finally:
        stop_router(server)
