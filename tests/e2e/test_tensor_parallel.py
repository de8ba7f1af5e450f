"""Tensor parallelism on CPU (gloo) through the router: the default model at --tp 3 (9 query
/ 3 KV heads, intermediate 1536 and vocabulary 49152 all split by 3) answers with the same
greedy text as tp 1; a group spread over three "hosts" (--nnodes 3) serves through
--worker like one worker; kill -9 of one rank ends the group's requests with an error and leaves no
rank of it running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from minisgl_worker.default_model import ensure_default_model

from tests.e2e.conftest import (
    Server,
    descendants,
    free_port,
    start_router,
    still_alive,
    stop_router,
)

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def greedy(server: Server, prompts: list[str], max_tokens: int) -> list[str]:
    def one(prompt: str) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=900)  # CPU CI runs 3 ranks on 2 cores
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(prompts)) as pool:  # one batch
        return list(pool.map(one, prompts))


def ranks(server: Server) -> set[int]:
    """The worker processes under the router (the group's ranks; not torch's helpers)."""
    found = set()
    for pid in descendants(server.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"minisgl_worker" in cmd or b"spawn_main" in cmd:
            found.add(pid)
    return found


@pytest.fixture(scope="module")
def tp3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("tp3"), "--tp", "3", "--device", "cpu")
    yield server
    stop_router(server)


def test_tp3_gives_the_tp1_greedy_text(server: Server, tp3: Server) -> None:
    health = requests.get(f"{tp3.base_url}/health", timeout=10).json()
    assert len(ranks(tp3)) >= 3, health
    want = greedy(server, PROMPTS, 32)
    assert greedy(tp3, PROMPTS, 32) == want


def test_tp3_serves_a_new_grammar_like_tp1(server: Server, tp3: Server) -> None:
    """A grammar the group has not cached compiles off each rank's loop; rank 0 tells the
    others when it is done, so that every rank queues the request at the same turn."""
    def constrained(target: Server, seed: int) -> str:
        body = {"model": MODEL, "prompt": "My code is", "max_tokens": 24, "temperature": 1.0,
                "seed": seed, "regex": f"[0-9]{{3}}-[a-z]{{2,4}}( ok)?{'!' * seed}"}
        r = requests.post(f"{target.base_url}/v1/completions", json=body, timeout=900)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(2) as pool:  # two new grammars, sent together
        on_tp3 = list(pool.map(lambda seed: constrained(tp3, seed), [1, 2]))
    assert on_tp3 == [constrained(server, seed) for seed in [1, 2]]


def test_kill_9_of_one_rank_fails_its_requests_and_takes_the_group_down(tp3: Server) -> None:
    group = ranks(tp3)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000,
            "ignore_eos": True, "stream": True}
    with requests.post(f"{tp3.base_url}/v1/completions", json=body, stream=True,
                       timeout=120) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith(b"data: {"))  # streaming
        spawned = [p for p in group if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(max(spawned), signal.SIGKILL)  # a rank other than 0
        events = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    assert "error" in events[-1], events[-1]
    assert events[-1]["error"]["code"] == "service_unavailable", events[-1]
    assert not still_alive(group, within_s=15), "ranks of the killed group still run"


def test_a_group_across_hosts_serves_like_one_worker(server: Server, tmp_path: Path) -> None:
    # Three "hosts" of one rank each: the model's 9 heads do not split over two hosts.
    port, dist_port = free_port(), free_port()
    base = [sys.executable, "-m", "minisgl_worker", "--model", ensure_default_model(),
            "--device", "cpu", "--tp", "3", "--nnodes", "3",
            "--dist-init-addr", f"127.0.0.1:{dist_port}"]
    logs = [(tmp_path / f"node{n}.log").open("w") for n in range(3)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # three "hosts" share this one's cores
    nodes = [subprocess.Popen([*base, "--node-rank", "0", "--listen", f"tcp://127.0.0.1:{port}"],
                              stdout=logs[0], stderr=subprocess.STDOUT, env=env)]
    nodes += [subprocess.Popen([*base, "--node-rank", str(n)], stdout=logs[n],
                               stderr=subprocess.STDOUT, env=env) for n in (1, 2)]
    router = None
    try:
        router = start_router(tmp_path, "--worker", f"tcp://127.0.0.1:{port}")
        assert greedy(router, PROMPTS[:1], 8) == greedy(server, PROMPTS[:1], 8)
    finally:
        if router is not None:
            router.proc.send_signal(signal.SIGINT)
            router.proc.wait(timeout=60)
        nodes[0].send_signal(signal.SIGTERM)
        code = nodes[0].wait(timeout=60)
        # The other hosts' ranks lose rank 0 in their next collective and exit too.
        for node in nodes[1:]:
            node.wait(timeout=60)
        for log in logs:
            log.close()
    assert code == 0, (tmp_path / "node0.log").read_text()[-2000:]
