"""A worker started elsewhere (`minisgl-router --worker tcp://...`): the router serves
through it, and when it restarts (a crash, a deploy) the requests it held fail with 503, the
router connects again, and serves once the new worker has said ready."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from minisgl_worker.default_model import ensure_default_model

from tests.e2e.conftest import Server, free_port, start_router

MODEL = "SmolLM2-135M-Instruct"


def start_worker(port: int, log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "minisgl_worker", "--model", ensure_default_model(),
           "--listen", f"tcp://127.0.0.1:{port}", "--device", "cpu"]
    with log_path.open("a") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def wait_health(server: Server, status: int, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        r = requests.get(f"{server.base_url}/health", timeout=5)
        if r.status_code == status:
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"/health never said {status}:\n{server.log_tail()}")


def complete(server: Server, prompt: str) -> requests.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    return requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)


def stop(server: Server | None, worker: subprocess.Popen) -> None:
    """The router (it must exit cleanly), then the worker: a remote worker outlives the
    router, and this one is ours to stop."""
    if server is not None:
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=60) == 0, server.log_tail()
    worker.kill()
    worker.wait()


def test_a_remote_worker_that_restarts_is_served_again(tmp_path: Path) -> None:
    port, log_path = free_port(), tmp_path / "worker.log"
    worker = start_worker(port, log_path)
    server = None
    try:
        server = start_router(tmp_path, "--worker", f"tcp://127.0.0.1:{port}")
        first = complete(server, "The capital of France is")
        assert first.status_code == 200, first.text
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        health = wait_health(server, 503, within_s=30)
        assert health["workers"][0]["status"] == "down", health
        refused = complete(server, "The capital of France is")
        assert refused.status_code == 503, refused.text
        worker = start_worker(port, log_path)  # the same address
        wait_health(server, 200, within_s=120)
        again = complete(server, "The capital of France is")
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        assert "connecting again" in server.log_path.read_text()
        assert "a router connected" in log_path.read_text()
    finally:
        stop(server, worker)


def test_a_remote_worker_that_stops_answering_is_marked_down_until_it_answers(
    tmp_path: Path,
) -> None:
    port, log_path = free_port(), tmp_path / "worker.log"
    worker = start_worker(port, log_path)
    server = None
    try:
        server = start_router(tmp_path, "--worker", f"tcp://127.0.0.1:{port}")
        assert complete(server, "The capital of France is").status_code == 200
        body = {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        with requests.post(
            f"{server.base_url}/v1/completions", json=body, stream=True, timeout=60
        ) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith(b"data: {"))  # streaming
            worker.send_signal(signal.SIGSTOP)  # alive, connected, silent
            stopped = time.monotonic()
            events = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
        assert time.monotonic() - stopped < 10
        assert "heartbeat" in events[-1]["error"]["message"], events[-1]
        health = wait_health(server, 503, within_s=5)
        assert health["workers"][0]["status"] == "down", health
        worker.send_signal(signal.SIGCONT)
        wait_health(server, 200, within_s=60)
        again = complete(server, "The capital of France is")
        assert again.status_code == 200, again.text
    finally:
        worker.send_signal(signal.SIGCONT)
        stop(server, worker)


def test_a_remote_worker_in_a_step_longer_than_the_heartbeat_is_not_taken_for_dead(
    tmp_path: Path,
) -> None:
    """One chunk of a ~7,900-token prompt is one CPU step of several seconds, past the
    router's 4 s heartbeat: the worker's beat (scheduler/io.py) keeps it heard from."""
    port, log_path = free_port(), tmp_path / "worker.log"
    worker = start_worker(port, log_path)
    server = None
    try:
        server = start_router(tmp_path, "--worker", f"tcp://127.0.0.1:{port}")
        assert complete(server, "The capital of France is").status_code == 200
        prompt = [1000 + (7 * i) % 9000 for i in range(7900)]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        t = time.monotonic()
        r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
        took = time.monotonic() - t
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 7900
        assert "heartbeat" not in server.log_path.read_text()
        if took < 4.5:
            pytest.skip(f"this machine prefilled 7,900 tokens in {took:.1f} s, within the "
                        "heartbeat: nothing was shown")
    finally:
        stop(server, worker)
