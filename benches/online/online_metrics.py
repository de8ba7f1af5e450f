"""Serving metrics of one benchmark run, defined as `vllm bench serve` defines them
(vllm/benchmarks/serve.py, `calculate_metrics`), from what the client saw of each request:

- TTFT: from sending the request to the first chunk that carries content (text or
  delta.content; a chat stream's role-only first chunk does not count).
- ITL: the gaps between consecutive content chunks, pooled over all requests.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request with more than one output token.
- E2E: from sending the request to the end of its stream.
- Output tokens: the server's `usage.completion_tokens` when it sent usage; else the
  generated text re-tokenized (as vllm does), when the client has the tokenizer; else the
  number of content chunks. The summary says which, per request.
- Throughput: completed requests, output tokens and all tokens per second of the run's
  duration (first send to the last stream's end); goodput: requests per second that met
  every given SLO (TTFT, TPOT, E2E in ms; TPOT counts as 0 for one-token outputs).

Percentiles are numpy's (linear interpolation), as vllm's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """One request as the client saw it; times are time.perf_counter() seconds."""

    prompt_len: int  # prompt tokens as drawn (the server's usage count replaces it)
    expected_output: int  # max_tokens asked for
    sent: float = 0.0
    chunks: list[float] = field(default_factory=list)  # arrival of each content chunk
    end: float = 0.0  # arrival of the stream's end ([DONE]), or of the failure
    text: str = ""
    usage_prompt: int | None = None
    usage_output: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunks)

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent

    @property
    def e2el(self) -> float:
        return self.end - self.sent

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:])]


def output_tokens(rec: RequestRecord,
                  count: Callable[[str], int] | None = None) -> tuple[int, str]:
    """(output tokens, where the figure came from: usage, tokenizer or chunks)."""
    if rec.usage_output is not None:
        return rec.usage_output, "usage"
    if count is not None:
        return count(rec.text), "tokenizer"
    return len(rec.chunks), "chunks"


def tpot(rec: RequestRecord, tokens: int) -> float | None:
    return (rec.e2el - rec.ttft) / (tokens - 1) if tokens > 1 else None


def stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    """mean and PERCENTILES of `values` (seconds) in ms; None where there are none."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(values, dtype=np.float64) * 1e3
    out: dict[str, float | None] = {"mean": float(a.mean())}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def parse_goodput(specs: Sequence[str]) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (ms), as vllm's --goodput."""
    slos = {}
    for spec in specs:
        name, sep, value = spec.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--goodput takes NAME:MS with NAME in {SLO_METRICS}; got {spec!r}")
        if float(value) <= 0:
            raise ValueError(f"--goodput {name} must be > 0 ms; got {value}")
        slos[name] = float(value)
    return slos


def summarize(records: Sequence[RequestRecord], duration_s: float,
              slos: dict[str, float] | None = None,
              count: Callable[[str], int] | None = None) -> dict:
    """The run's metrics as one JSON-ready dict."""
    ttfts, tpots, itls, e2els, good = [], [], [], [], 0
    sources: Counter[str] = Counter()
    total_in = total_out = expected_out = 0
    for rec in records:
        if not rec.ok:
            continue
        tokens, source = output_tokens(rec, count)
        sources[source] += 1
        total_out += tokens
        expected_out += rec.expected_output
        total_in += rec.usage_prompt if rec.usage_prompt is not None else rec.prompt_len
        ttfts.append(rec.ttft)
        e2els.append(rec.e2el)
        itls.extend(rec.itl)
        t = tpot(rec, tokens)
        if t is not None:
            tpots.append(t)
        seen = {"ttft": rec.ttft, "tpot": t or 0.0, "e2el": rec.e2el}
        good += all(seen[k] * 1e3 <= v for k, v in (slos or {}).items())
    completed = len(ttfts)
    errors = Counter(r.error or "no content chunk" for r in records if not r.ok)
    return {
        "completed": completed,
        "failed": len(records) - completed,
        "errors": dict(errors.most_common(5)),
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "expected_output_tokens": expected_out,
        "output_tokens_from": dict(sources),
        "request_throughput": completed / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "goodput_slos_ms": slos or None,
        "request_goodput": good / duration_s if slos else None,
        "ttft_ms": stats_ms(ttfts),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms(itls),
        "e2el_ms": stats_ms(e2els),
    }
