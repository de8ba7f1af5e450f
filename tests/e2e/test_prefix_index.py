"""The router's prefix index against the worker's truth: for every request of a workload
whose prefixes outgrow the worker's KV (and get evicted), the cached tokens the index
predicted when it sent the request equal the `cached_tokens` the worker reported, exactly;
and a worker killed and restarted starts empty in the index.

The prediction is taken when the request is sent. The requests go one at a time: the worker
reports each step's cache changes before its tokens, so when a request ends the index holds
what its end stored, and nothing changes in the worker's cache before the next request is
admitted (routing/index.rs says which overlaps can legitimately differ)."""

import os
import random
import signal
import time

import pytest
import requests

from tests.e2e.conftest import Server, metric, start_router, stop_router
from tests.e2e.test_supervision import restarts, wait_until, worker_pid

KV_TOKENS = 384  # 24 pages of 16: a request takes 9, the cache holds about two prefixes
PREFIX, SUFFIX = 128, 8
ORDER = [0, 1, 0, 2, 3, 0, 1, 2, 2, 3, 0, 1]  # revisits, some after eviction
INDEX = ("requests", "predicted_tokens", "reported_tokens", "mismatches")


@pytest.fixture(scope="module")
def small_kv(tmp_path_factory: pytest.TempPathFactory) -> Server:
    server = start_router(tmp_path_factory.mktemp("index"), "--kv-tokens", str(KV_TOKENS))
    yield server
    stop_router(server)


def index_metrics(server: Server) -> dict[str, float]:
    text = requests.get(f"{server.base_url}/metrics", timeout=10).text
    out = {name: metric(text, f"minisgl_prefix_index_{name}_total") for name in INDEX}
    out["index_tokens"] = metric(text, "minisgl_prefix_index_cached_tokens")
    return out


def worker_cached_tokens(server: Server) -> float:
    """The cached tokens of the worker's last load report (sent each second)."""
    return metric(requests.get(f"{server.base_url}/metrics", timeout=10).text,
                  "minisgl_kv_cache_cached_tokens")


def complete(server: Server, prompt: list[int]) -> int:
    """Cached tokens the worker reported for a greedy 2-token completion of `prompt`."""
    body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 2,
            "temperature": 0, "ignore_eos": True}
    resp = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_predicted_cached_tokens_equal_the_workers_through_evictions(small_kv: Server) -> None:
    rng = random.Random(7)
    prefixes = [[rng.randint(100, 10000) for _ in range(PREFIX)] for _ in range(4)]
    before = index_metrics(small_kv)
    reported, evicted = [], 0
    for group in ORDER:
        prompt = prefixes[group] + [rng.randint(100, 10000) for _ in range(SUFFIX)]
        cached = complete(small_kv, prompt)
        after = index_metrics(small_kv)
        delta = {k: after[k] - before[k] for k in INDEX}
        assert delta == {"requests": 1, "predicted_tokens": cached, "reported_tokens": cached,
                         "mismatches": 0}, (group, cached, delta)
        assert after["index_tokens"] <= KV_TOKENS
        evicted += group in ORDER[: len(reported)] and cached < PREFIX // 16 * 16
        reported.append(cached)
        before = after
    print(f"cached tokens per request: {reported}; {evicted} revisits found their prefix evicted")
    assert sum(c > 0 for c in reported) >= 3 and evicted >= 2, reported
    # Idle, the index holds exactly what the worker's cache holds (by its next load report).
    index_tokens = index_metrics(small_kv)["index_tokens"]
    deadline = time.monotonic() + 10
    while worker_cached_tokens(small_kv) != index_tokens:
        assert time.monotonic() < deadline, (index_tokens, worker_cached_tokens(small_kv))
        time.sleep(0.2)
    assert index_tokens > 0


def test_a_restarted_worker_starts_empty_in_the_index(small_kv: Server) -> None:
    """kill -9 of the worker: its cache is gone, and so is its share of the index; the
    predictions stay exact after its restart."""
    prompt = list(range(200, 200 + 2 * PREFIX + SUFFIX))  # the last page is partial
    complete(small_kv, prompt)
    assert index_metrics(small_kv)["index_tokens"] > 0
    os.kill(worker_pid(small_kv, 0), signal.SIGKILL)
    wait_until(lambda: restarts(small_kv) == [1], 120, small_kv)
    wait_until(lambda: requests.get(f"{small_kv.base_url}/health", timeout=10).ok, 120,
               small_kv)
    before = index_metrics(small_kv)
    assert before["index_tokens"] == 0
    assert complete(small_kv, prompt) == 0  # computed again, as predicted
    assert complete(small_kv, prompt) == 2 * PREFIX
    after = index_metrics(small_kv)
    assert after["predicted_tokens"] - before["predicted_tokens"] == 2 * PREFIX
    assert after["mismatches"] == before["mismatches"]
