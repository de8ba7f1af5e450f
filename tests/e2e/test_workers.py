"""`minisgl-router --workers 2`: two real CPU workers behind one router."""

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import Server, descendants, start_router, still_alive, stop_router

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [
    "The capital of France is",
    "Water boils at",
    "def add(a, b):",
    "My favourite colour is",
    "Once upon a time",
    "The largest planet in the solar system is",
]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("two-workers"), "--workers", "2")
    yield server
    stop_router(server)  # both workers must exit with it


def complete(server: Server, prompt: str, max_tokens: int = 12) -> dict:
    resp = requests.post(
        f"{server.base_url}/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def prompt_tokens_per_worker(server: Server, at_least: int) -> list[int]:
    """Each worker's cumulative prompt tokens, from its `load` reports in /health."""
    deadline = time.monotonic() + 10
    while True:
        workers = requests.get(f"{server.base_url}/health", timeout=10).json()["workers"]
        counts = [(w.get("load") or {}).get("prompt_tokens", 0) for w in workers]
        if sum(counts) >= at_least or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


def test_both_workers_serve_and_agree(two_workers: Server) -> None:
    health = requests.get(f"{two_workers.base_url}/health", timeout=10).json()
    assert [w["status"] for w in health["workers"]] == ["ready", "ready"]

    alone = [complete(two_workers, p)["choices"][0]["text"] for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = [
            r["choices"][0]["text"] for r in pool.map(lambda p: complete(two_workers, p), PROMPTS)
        ]
    assert together == alone
    # Distinct prompts are spread over the caches: both workers did prefill work.
    counts = prompt_tokens_per_worker(
        two_workers, at_least=2 * sum(len(p.split()) for p in PROMPTS)
    )
    assert all(c > 0 for c in counts), counts


def test_a_shared_prefix_goes_back_to_the_worker_that_caches_it(two_workers: Server) -> None:
    prefix = " ".join(f"item{i}" for i in range(150))  # several hundred tokens
    first = complete(two_workers, prefix + " first", max_tokens=2)
    second = complete(two_workers, prefix + " second", max_tokens=2)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * (first["usage"]["prompt_tokens"] - 2), second["usage"]


def prompt_tokens_after(server: Server, before: list[int], sent: int) -> list[int]:
    """Each worker's prompt tokens since `before`, once `sent` of them were reported."""
    deadline = time.monotonic() + 10
    while True:
        delta = [a - b for a, b in zip(prompt_tokens_per_worker(server, 0), before, strict=True)]
        if sum(delta) >= sent or time.monotonic() > deadline:
            return delta
        time.sleep(0.3)


def settled_prompt_tokens(server: Server) -> list[int]:
    """Each worker's prompt tokens once earlier requests are all reported: two readings
    further apart than a `load` interval (1 s idle) agree."""
    last = prompt_tokens_per_worker(server, 0)
    while True:
        time.sleep(1.5)
        now = prompt_tokens_per_worker(server, 0)
        if now == last:
            return now
        last = now


def shared_prefix_requests(server: Server, tag: str) -> tuple[list[int], int]:
    """Four requests sharing a long prefix, one after another -> (prompt tokens each
    worker computed or cached for them, the prompt tokens sent)."""
    before = settled_prompt_tokens(server)
    prefix = " ".join(f"{tag}{i}" for i in range(120))
    sent = sum(
        complete(server, f"{prefix} question {q}", max_tokens=1)["usage"]["prompt_tokens"]
        for q in range(4)
    )
    return prompt_tokens_after(server, before, sent), sent


def routing_decisions(server: Server) -> dict[str, float]:
    """minisgl_routing_decisions_total summed over the workers, by reason."""
    totals: dict[str, float] = {}
    for line in requests.get(f"{server.base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("minisgl_routing_decisions_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            totals[reason] = totals.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return totals


def test_cache_aware_keeps_a_shared_prefix_on_one_worker(two_workers: Server) -> None:
    before = routing_decisions(two_workers)
    delta, sent = shared_prefix_requests(two_workers, "cacheaware")
    assert sorted(delta) == [0, sent], delta
    # The first request's prefix was new (spread), the three after it followed it (prefix).
    after = routing_decisions(two_workers)
    moved = {reason: after[reason] - before.get(reason, 0) for reason in after}
    assert moved == {"prefix": 3, "spread": 1, "balance": 0, "policy": 0}, moved


def test_workers_exit_when_the_router_is_killed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGKILL leaves the router no chance to send `shutdown`: its worker notices that its
    parent is gone (`--parent-pid`) and exits instead of holding its memory forever."""
    server = start_router(tmp_path_factory.mktemp("killed"))
    workers = descendants(server.proc.pid)
    assert workers, "the router should have spawned a worker process"
    socket_file = Path(f"/tmp/minisgl-{server.proc.pid}-0.sock")  # launcher.rs's path
    assert socket_file.exists()
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=10)
    assert not still_alive(workers, within_s=20), server.log_tail()
    assert "is gone: exiting" in server.log_path.read_text()
    assert not socket_file.exists()  # the worker removed it on its way out


def test_workers_exit_when_the_router_is_killed_mid_generation(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same with a request streaming: the worker has tokens to send and nobody to send
    them to; it must not wait for a reader that will never come back."""
    server = start_router(tmp_path_factory.mktemp("killed-busy"))
    workers = descendants(server.proc.pid)
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
        assert next(line for line in lines if line.startswith(b"data: {"))  # generating
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
    assert not still_alive(workers, within_s=20), server.log_tail()
    assert "is gone: exiting" in server.log_path.read_text()
