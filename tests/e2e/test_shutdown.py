"""Graceful shutdown: SIGTERM lets the requests in flight finish (up to --shutdown-timeout,
then aborts the rest), refuses new ones with 503 meanwhile, exits 0, and leaves no worker
process and no socket file behind; the same when a worker is still loading, and when the
router is killed outright."""

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import Server, descendants, launch_router, start_router, still_alive

MODEL = "SmolLM2-135M-Instruct"


def socket_files(router_pid: int) -> list[Path]:
    """The ipc socket files of this router's workers (launcher.rs names them by its pid)."""
    return sorted(Path("/tmp").glob(f"minisgl-{router_pid}-*.sock"))


def stream(server: Server, max_tokens: int, started: set[int]) -> tuple[int, str | None, str]:
    """Streams a completion -> (completion tokens in its usage, finish_reason, error message);
    its thread's id joins `started` with its first event."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    tokens, finish, error = 0, None, ""
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True,
                       timeout=300) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: "):])
            started.add(threading.get_ident())
            if "error" in event:
                error = event["error"]["message"]
            elif event["choices"]:
                finish = event["choices"][0]["finish_reason"] or finish
            elif event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return tokens, finish, error


def wait_gone(server: Server, workers: set[int], within_s: float) -> None:
    assert workers, "the router should have spawned a worker process"
    assert not still_alive(workers, within_s=within_s), server.log_tail()
    assert not socket_files(server.proc.pid), server.log_tail()


def test_sigterm_finishes_requests_in_flight_and_refuses_new_ones_a_second_aborts(
    tmp_path: Path,
) -> None:
    """(--shutdown-timeout itself is tested in the router's own tests, without a clock race
    against a CPU of unknown speed.)"""
    server = start_router(tmp_path, "--shutdown-timeout", "600")
    workers = descendants(server.proc.pid)
    assert socket_files(server.proc.pid)
    started: set[int] = set()
    with ThreadPoolExecutor(3) as pool:
        short = [pool.submit(stream, server, 8, started) for _ in range(2)]
        long = pool.submit(stream, server, 4000, started)
        deadline = time.monotonic() + 120
        while len(started) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(started) == 3, server.log_tail()
        server.proc.send_signal(signal.SIGTERM)
        # New requests are refused while those in flight finish; /health says so too.
        deadline = time.monotonic() + 10
        while requests.get(f"{server.base_url}/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}
        refused = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
        assert refused.status_code == 503, refused.text
        assert "shutting down" in refused.json()["error"]["message"]
        for done in short:
            assert done.result() == (8, "length", "")
        assert not long.done()
        server.proc.send_signal(signal.SIGTERM)  # the second: abort the rest now
        tokens, finish, error = long.result()
    assert finish is None and tokens < 4000
    assert "--shutdown-timeout" in error
    assert server.proc.wait(timeout=60) == 0, server.log_tail()
    wait_gone(server, workers, within_s=10)
    assert "aborted 1 request(s) still in flight" in server.log_path.read_text()


def spawned_worker(server: Server, within_s: float = 60) -> set[int]:
    """The router's worker processes, as soon as there are some (they are loading then)."""
    deadline = time.monotonic() + within_s
    while not (workers := descendants(server.proc.pid)):
        if time.monotonic() > deadline or server.proc.poll() is not None:
            pytest.fail(f"no worker process:\n{server.log_tail()}")
        time.sleep(0.02)
    return workers


def test_sigterm_while_the_worker_loads_exits_0_and_leaves_nothing(tmp_path: Path) -> None:
    server = launch_router(tmp_path)
    workers = spawned_worker(server)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0, server.log_tail()
    assert "shutting down while the workers were starting" in server.log_path.read_text()
    wait_gone(server, workers, within_s=10)


def test_kill_9_while_the_worker_loads_leaves_nothing(tmp_path: Path) -> None:
    """The worker notices that the router is gone even before its model is loaded."""
    server = launch_router(tmp_path)
    workers = spawned_worker(server)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=10)
    wait_gone(server, workers, within_s=60)
    assert "is gone: exiting" in server.log_path.read_text()
