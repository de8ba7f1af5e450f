"""The non-OpenAI endpoints against the real router: /tokenize, /detokenize (vLLM's shapes),
the native /generate, and /metrics (Prometheus text)."""

import itertools
import json

import requests

from tests.e2e.conftest import Server, metric

MODEL = "SmolLM2-135M-Instruct"
ANSWER = "The capital of France is Paris."


def post(server: Server, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.base_url}{path}", json=body, timeout=300)


def test_tokenize_detokenize_round_trip(server: Server) -> None:
    text = "Hello, wörld! 🦀"
    resp = post(server, "/tokenize", {"model": MODEL, "prompt": text})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] > 0
    resp = post(server, "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert resp.json() == {"prompt": text}


def test_tokenize_messages_counts_the_chat_prompt(server: Server) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    count = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()["count"]
    resp = server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert resp.usage.prompt_tokens == count


def test_generate_with_text_and_input_ids(server: Server) -> None:
    params = {"temperature": 0, "max_new_tokens": 4}
    # Longer than a KV page (16 tokens on CPU): only whole pages are cached.
    text = ("The capital of Italy is Rome. The capital of Spain is Madrid. "
            "The capital of France is")
    resp = post(server, "/generate", {"text": text, "sampling_params": params})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert len(body["output_ids"]) == 4 and body["text"]
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 4 and meta["finish_reason"] == "length"
    ids = post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    assert len(ids) > 16, len(ids)
    again = post(server, "/generate", {"input_ids": ids, "sampling_params": params}).json()
    assert again["text"] == body["text"] and again["output_ids"] == body["output_ids"]
    assert again["meta_info"]["prompt_tokens"] == len(ids)
    assert again["meta_info"]["cached_tokens"] > 0, "the same prompt hit the prefix cache"


def test_generate_streams_cumulative_text(server: Server) -> None:
    body = {
        "text": "The capital of France is",
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 4},
    }
    with requests.post(f"{server.base_url}/generate", json=body, stream=True) as resp:
        events = [
            line[6:] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")
        ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["meta_info"]["finish_reason"] == "length"
    assert all(a["text"] in b["text"] for a, b in itertools.pairwise(chunks))


def test_metrics_after_requests(server: Server) -> None:
    prompt = "Tell me a story about a dragon who learns to fly. " * 4
    for _ in range(2):  # the second one reuses the cached prompt
        server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    text = requests.get(f"{server.base_url}/metrics").text
    assert metric(text, 'minisgl_requests_total{endpoint="/v1/completions",status="200"}') >= 2
    for histogram in (
        "time_to_first_token",
        "time_per_output_token",
        "inter_token_latency",
        "e2e_request_latency",
    ):
        assert metric(text, f"minisgl_{histogram}_seconds_count") >= 2
    assert metric(text, "minisgl_generation_tokens_total") >= 8
    assert metric(text, "minisgl_kv_cache_total_tokens") > 0
    assert metric(text, "minisgl_kv_cache_cached_tokens") > 0
    metric(text, "minisgl_kv_cache_used_tokens")
    metric(text, "minisgl_num_requests_waiting")
    metric(text, "minisgl_num_requests_running")
    assert metric(text, "minisgl_prefix_cache_hit_rate") > 0
