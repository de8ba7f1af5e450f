"""benches/online/online_metrics.py and the stream reader of benches/online/online_client.py on synthetic
streams with known timings: the figures vllm's definitions give by hand."""

import asyncio
import json

import numpy as np
import pytest
from online_client import read_stream
from online_metrics import RequestRecord, parse_goodput, summarize


def record(sent: float, chunks: list[float], end: float, usage: int | None = None,
           text: str = "") -> RequestRecord:
    rec = RequestRecord(prompt_len=10, expected_output=len(chunks), sent=sent, end=end,
                        text=text, usage_output=usage)
    rec.chunks = chunks
    return rec


def test_one_request_ttft_itl_tpot_e2e() -> None:
    # sent at 1.0; content at +100, +150, +250, +300 ms; stream ends at +310 ms; 4 tokens
    rec = record(1.0, [1.1, 1.15, 1.25, 1.3], 1.31, usage=4)
    m = summarize([rec], duration_s=0.31)
    assert m["completed"] == 1 and m["failed"] == 0
    assert m["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert m["itl_ms"]["mean"] == pytest.approx((50 + 100 + 50) / 3)
    assert m["itl_ms"]["p50"] == pytest.approx(50.0)
    assert m["tpot_ms"]["mean"] == pytest.approx((310 - 100) / 3)  # (E2E - TTFT) / (4 - 1)
    assert m["e2el_ms"]["p99"] == pytest.approx(310.0)
    assert m["output_throughput"] == pytest.approx(4 / 0.31)
    assert m["request_throughput"] == pytest.approx(1 / 0.31)
    assert m["total_token_throughput"] == pytest.approx((10 + 4) / 0.31)
    assert m["output_tokens_from"] == {"usage": 1}


def test_percentiles_interpolate_as_numpy() -> None:
    ttfts = [0.1, 0.2, 0.3, 0.4, 0.5]
    recs = [record(0.0, [t, t + 0.01], t + 0.02, usage=2) for t in ttfts]
    m = summarize(recs, duration_s=1.0)["ttft_ms"]
    assert m["p50"] == pytest.approx(300.0)
    assert m["p90"] == pytest.approx(460.0)  # 400 + 0.6 * 100
    assert m["p99"] == pytest.approx(496.0)
    assert m["p99"] == pytest.approx(float(np.percentile(np.array(ttfts) * 1e3, 99)))


def test_output_tokens_without_usage_come_from_the_tokenizer_else_the_chunks() -> None:
    # 3 chunks, but the text holds 5 tokens (a chunk may carry several)
    rec = record(0.0, [0.1, 0.2, 0.3], 0.4, usage=None, text="a b c d e")
    by_tokenizer = summarize([rec], 1.0, count=lambda s: len(s.split()))
    assert by_tokenizer["total_output_tokens"] == 5
    assert by_tokenizer["output_tokens_from"] == {"tokenizer": 1}
    assert by_tokenizer["tpot_ms"]["mean"] == pytest.approx((400 - 100) / 4)
    by_chunks = summarize([rec], 1.0)
    assert by_chunks["total_output_tokens"] == 3
    assert by_chunks["output_tokens_from"] == {"chunks": 1}
    assert by_chunks["tpot_ms"]["mean"] == pytest.approx((400 - 100) / 2)


def test_failures_are_counted_and_left_out_of_the_latencies() -> None:
    good = record(0.0, [0.1, 0.2], 0.3, usage=2)
    http = record(0.0, [], 0.05)
    http.error = "HTTP 503: busy"
    empty = record(0.0, [], 0.5)  # a stream without a content chunk
    m = summarize([good, http, empty], 1.0)
    assert (m["completed"], m["failed"]) == (1, 2)
    assert m["errors"] == {"HTTP 503: busy": 1, "no content chunk": 1}
    assert m["ttft_ms"]["p99"] == pytest.approx(100.0)
    assert m["total_output_tokens"] == 2


def test_goodput_counts_requests_within_every_slo() -> None:
    fast = record(0.0, [0.05, 0.06, 0.07], 0.08, usage=3)  # TTFT 50 ms, TPOT 15 ms
    slow_first = record(0.0, [0.3, 0.31, 0.32], 0.33, usage=3)  # TTFT 300 ms
    slow_tokens = record(0.0, [0.05, 0.25, 0.45], 0.46, usage=3)  # TPOT 205 ms
    one_token = record(0.0, [0.05], 0.06, usage=1)  # TPOT counts as 0
    recs = [fast, slow_first, slow_tokens, one_token]
    m = summarize(recs, 2.0, slos=parse_goodput(["ttft:100", "tpot:50"]))
    assert m["request_goodput"] == pytest.approx(2 / 2.0)
    assert summarize(recs, 2.0)["request_goodput"] is None
    assert summarize(recs, 2.0)["tpot_ms"]["p50"] == pytest.approx(15.0)  # 3 multi-token


def test_parse_goodput_names_the_field_and_the_limit() -> None:
    with pytest.raises(ValueError, match="NAME in"):
        parse_goodput(["latency:5"])
    with pytest.raises(ValueError, match="must be > 0 ms"):
        parse_goodput(["ttft:0"])


async def lines(events: list[tuple[float, bytes]], clock: list[float]):
    """An SSE body as aiohttp's line iterator yields it; sets the clock to each line's time."""
    for t, line in events:
        clock[0] = t
        yield line


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n"


def test_read_stream_chat_skips_the_role_chunk_and_reads_usage() -> None:
    delta = lambda d: sse({"choices": [{"index": 0, "delta": d}]})
    events = [
        (0.02, delta({"role": "assistant", "content": ""})),  # no content: not the first token
        (0.03, b"\n"),
        (0.10, delta({"content": " Paris"})),
        (0.12, delta({"content": "."})),
        (0.13, delta({})),  # the finish chunk
        (0.14, sse({"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 2}})),
        (0.15, b"data: [DONE]\n"),
    ]
    clock = [0.0]
    rec = RequestRecord(prompt_len=30, expected_output=2, sent=0.0)
    asyncio.run(read_stream(lines(events, clock), rec, chat=True, clock=lambda: clock[0]))
    assert rec.ok and rec.error is None
    assert rec.chunks == [0.10, 0.12]
    assert rec.text == " Paris."
    assert (rec.usage_prompt, rec.usage_output, rec.end) == (31, 2, 0.15)
    m = summarize([rec], 0.15)
    assert m["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert m["total_input_tokens"] == 31  # the server's count, template included


def test_read_stream_completions_and_a_stream_cut_short() -> None:
    events = [(0.05, sse({"choices": [{"text": "a"}]})), (0.07, sse({"choices": [{"text": "b"}]}))]
    clock = [0.0]
    rec = RequestRecord(prompt_len=3, expected_output=2, sent=0.0)
    asyncio.run(read_stream(lines(events, clock), rec, chat=False, clock=lambda: clock[0]))
    assert rec.chunks == [0.05, 0.07] and rec.text == "ab"
    assert rec.error == "the stream ended before [DONE]" and not rec.ok


def test_read_stream_error_event_fails_the_request() -> None:
    events = [(0.05, sse({"error": {"message": "`max_tokens` must be >= 1; got 0"}}))]
    clock = [0.0]
    rec = RequestRecord(prompt_len=3, expected_output=0, sent=0.0)
    asyncio.run(read_stream(lines(events, clock), rec, chat=False, clock=lambda: clock[0]))
    assert not rec.ok and "max_tokens" in (rec.error or "")
