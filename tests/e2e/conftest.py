"""A real `minisgl-router` (default model, one CPU worker) shared by the end-to-end tests."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from openai import OpenAI

READY_TIMEOUT_S = 900  # first use converts the default model


@dataclass
class Server:
    base_url: str
    proc: subprocess.Popen
    log_path: Path

    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=300)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def metric(text: str, name: str) -> float:
    """The sum of a series' samples in /metrics text (over its labels)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    ]
    assert values, f"{name} not in /metrics"
    return sum(values)


def worker_metrics(base_url: str) -> dict[str, float]:
    """The router's in-flight count and the worker's load, from /metrics."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    names = ("requests_in_flight", "num_requests_running", "num_requests_waiting",
             "kv_cache_used_tokens", "generation_tokens_total")
    return {name: metric(text, f"minisgl_{name}") for name in names}


def wait_idle(base_url: str, timeout_s: float = 30) -> dict[str, float]:
    """Nothing in flight in the router, nothing running and no KV held in the worker."""
    def idle() -> dict[str, float] | None:
        try:
            m = worker_metrics(base_url)
        except AssertionError:  # the worker's load series: absent until its first report
            return None
        busy = m["requests_in_flight"] + m["num_requests_running"] + m["num_requests_waiting"]
        return m if busy == 0 and m["kv_cache_used_tokens"] == 0 else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = idle()
        if m is not None:
            return m
        time.sleep(0.1)
    raise AssertionError(f"not idle within {timeout_s} s: {worker_metrics(base_url)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_router(tmp: Path, *args: str) -> Server:
    """A router that answers /health with 200 (its workers are ready)."""
    return wait_healthy(launch_router(tmp, *args))


def launch_router(tmp: Path, *args: str) -> Server:
    """A router process, just started (its workers are not ready yet)."""
    port = free_port()
    exe = Path(sys.executable).parent / "minisgl-router"
    log_path = tmp / f"router-{port}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(exe), "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Server(f"http://127.0.0.1:{port}", proc, log_path)


def wait_healthy(server: Server) -> Server:
    proc = server.proc
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"router exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if requests.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"router not healthy after {READY_TIMEOUT_S} s:\n{server.log_tail()}")


def stop_router(server: Server) -> None:
    """Ctrl-C the router; it must exit 0 and take its workers with it."""
    workers = descendants(server.proc.pid)
    assert workers, "the router should have spawned a worker process"
    server.proc.send_signal(signal.SIGINT)
    try:
        code = server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        pytest.fail(f"router did not exit within 60 s of SIGINT:\n{server.log_tail()}")
    assert code == 0, server.log_tail()
    assert not still_alive(workers, within_s=10), "worker processes outlived the router"


def still_alive(pids: set[int], within_s: float) -> list[int]:
    """The processes of `pids` still alive after waiting up to `within_s` for them to exit."""
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared router: default flags but --log-requests (test_request_ids.py reads it)."""
    server = start_router(tmp_path_factory.mktemp("router"), "--log-requests")
    yield server
    stop_router(server)
