"""Clients that go away: 200 streams cancelled at random points (queued, prefilling,
decoding) and non-streamed requests whose client times out are aborted in the worker; once
idle no KV is held, the disconnects are counted, and the router's tasks and memory do not
grow. Streams are short (a few tokens, a short prompt) and many run at once, so the cancel
points fall in every phase (queued behind the others, prefilling, decoding) without each
stream paying for a long generation."""

import random
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.e2e.conftest import Server, metric, wait_idle

MODEL = "SmolLM2-135M-Instruct"
STREAMS = 200
WARM_UP = 40  # streams before the router's RSS is taken as the baseline
CLIENTS = 16
TOKENS = 12
# Allowed RSS growth over the last 160 streams: allocator noise, not a leak (a leaked stream
# state or task per request would show as a steady climb far past this).
RSS_MARGIN = 0.05


def cancelled_stream(server: Server, seed: int) -> None:
    """A stream closed after a random number of lines (0: before any token arrives)."""
    rng = random.Random(seed)
    body = {"model": MODEL, "prompt": f"Story {seed}:", "max_tokens": TOKENS,
            "ignore_eos": True, "stream": True}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True,
                       timeout=120) as resp:
        assert resp.status_code == 200, resp.text
        lines = resp.iter_lines()
        for _ in range(rng.randrange(0, TOKENS + 1)):
            if next(lines, None) is None:
                break


def abandoned_request(server: Server) -> None:
    """A non-streamed request whose client gives up before the answer."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    try:
        requests.post(f"{server.base_url}/v1/completions", json=body, timeout=0.5)
    except requests.Timeout:
        return


def metrics_text(server: Server) -> str:
    return requests.get(f"{server.base_url}/metrics", timeout=10).text


def test_cancelled_requests_free_their_kv_and_leave_no_tasks(server: Server) -> None:
    wait_idle(server.base_url)
    before = metrics_text(server)
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda i: cancelled_stream(server, i), range(WARM_UP)))
        wait_idle(server.base_url, timeout_s=60)
        warm = metric(metrics_text(server), "process_resident_memory_bytes")
        list(pool.map(lambda i: cancelled_stream(server, i), range(WARM_UP, STREAMS)))
        list(pool.map(lambda _: abandoned_request(server), range(4)))
    idle = wait_idle(server.base_url, timeout_s=60)
    assert idle["kv_cache_used_tokens"] == 0
    after = metrics_text(server)
    disconnects = metric(after, "minisgl_client_disconnects_total")
    assert disconnects - metric(before, "minisgl_client_disconnects_total") >= 4
    tasks = metric(after, "minisgl_router_tasks")
    assert tasks <= metric(before, "minisgl_router_tasks") + 4, (before, after)
    rss = metric(after, "process_resident_memory_bytes")
    print(f"router RSS after {WARM_UP} streams {warm / 2**20:.1f} MiB, after {STREAMS} "
          f"{rss / 2**20:.1f} MiB ({(rss / warm - 1) * 100:+.1f}%)")
    assert rss <= warm * (1 + RSS_MARGIN), (warm, rss)
