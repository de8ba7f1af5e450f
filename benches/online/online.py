"""Online serving benchmark: a streaming load generator for any OpenAI-compatible server.

    python benches/online.py --base-url http://127.0.0.1:8000 --endpoint /v1/chat/completions \\
        --tokenizer ~/.cache/minisgl/SmolLM2-135M-Instruct --dataset random \\
        --input-len 256 --output-len 64 --request-rates 4,16,inf --num-prompts 64 \\
        --label minisgl --json /tmp/online.jsonl

Each rate is one run: its requests (a fresh draw of the dataset, seeded by --seed and the
rate's position, so no rate finds an earlier one's prompts in a prefix cache, and every
system gets the same ones) are sent at Poisson arrivals of that rate (`inf`: all at once),
at most --max-concurrency in flight, each streamed to its end. Metrics are those of
`vllm bench serve` (benches/online_metrics.py); each run prints a table and appends one
JSON line to --json. --client-procs spreads the requests over forked client processes
sharing one schedule, so that a client parsing tens of thousands of chunks a second does
not become the bottleneck it measures. --warmup requests (another draw) go first, unmeasured.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import urllib.request
from pathlib import Path

import numpy as np
import online_datasets as ds
from online_client import run_jobs
from online_metrics import RequestRecord, parse_goodput, stats_ms, summarize


def schedule(rate: float, n: int, seed: int) -> list[float]:
    """Send offsets (s): Poisson arrivals at `rate` req/s (first at 0), or all at 0."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return [0.0, *np.cumsum(gaps[:-1]).tolist()]


def load_tokenizer(path: str | None):
    if path is None:
        return None
    from tokenizers import Tokenizer

    p = Path(path).expanduser()
    return Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))


def make_requests(args: argparse.Namespace, tok, n: int, seed: int) -> list[ds.Request]:
    maker = ds.PromptMaker(tok, args.prompt_kind, random.Random(seed))
    if args.dataset == "random":
        return ds.random_set(maker, n, args.input_len, args.output_len, args.range_ratio)
    if args.dataset == "shared-prefix":
        return ds.shared_prefix_set(maker, n, args.groups, args.system_len, args.input_len,
                                    args.output_len)
    return ds.sharegpt_set(maker, n, seed, args.input_median, args.input_sigma,
                           args.output_median, args.output_sigma, args.input_max,
                           args.output_max)


def request_body(args: argparse.Namespace, model: str, req: ds.Request) -> bytes:
    body: dict = {"model": model, "max_tokens": req.output_len, "stream": True,
                  "temperature": args.temperature, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint.endswith("/chat/completions"):
        body["messages"] = req.messages
    else:
        body["prompt"] = req.text
    return json.dumps(body).encode()


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as resp:
        return json.load(resp)["data"][0]["id"]


def prompts_for(args: argparse.Namespace, rate: float) -> int:
    """--num-prompts, or fewer at a finite rate: enough for --duration seconds of arrivals."""
    if math.isinf(rate) or not args.duration:
        return args.num_prompts
    return min(args.num_prompts, max(args.min_prompts, math.ceil(rate * args.duration)))


def run_once(args: argparse.Namespace, model: str, reqs: list[ds.Request], rate: float,
             seed: int, count, keep: str | None = None) -> dict:
    """One rate's run -> its metrics; `keep`: a file for its records (write_records)."""
    chat = args.endpoint.endswith("/chat/completions")
    offsets = schedule(rate, len(reqs), seed)
    jobs = [(t, request_body(args, model, r), RequestRecord(r.prompt_len, r.output_len))
            for t, r in zip(offsets, reqs)]
    records, start = run_jobs(args.base_url + args.endpoint, jobs, args.client_procs,
                              args.max_concurrency, args.request_timeout, chat)
    duration = max(r.end for r in records) - start
    result = summarize(records, duration, parse_goodput(args.goodput), count)
    if keep:
        write_records(keep, args.label, args.tag, rate, records, start)
    # How late the client sent each request against its schedule: a client that cannot keep
    # up shows here (with --max-concurrency, waiting for a free slot counts too).
    result["send_lag_ms"] = stats_ms([r.sent - start - t for t, r in zip(offsets, records)])
    return result


def write_records(path: str, label: str, tag: str, rate: float,
                  records: list[RequestRecord], start: float) -> None:
    """One JSON line per request: when it was sent, its first token and its end (ms from
    the run's start), its prompt and output tokens, and its longest gap between tokens."""
    with open(path, "a") as f:
        for r in records:
            gaps = r.itl
            f.write(json.dumps({
                "label": label, "tag": tag, "rate": rate, "prompt": r.usage_prompt or r.prompt_len,
                "output": r.usage_output, "sent_ms": round((r.sent - start) * 1e3, 2),
                "first_ms": round((r.chunks[0] - start) * 1e3, 2) if r.chunks else None,
                "end_ms": round((r.end - start) * 1e3, 2),
                "max_gap_ms": round(max(gaps) * 1e3, 2) if gaps else None,
                "error": r.error}) + "\n")


def describe(args: argparse.Namespace) -> dict:
    keys = {"random": ["input_len", "output_len", "range_ratio"],
            "shared-prefix": ["groups", "system_len", "input_len", "output_len"],
            "sharegpt": ["input_median", "input_sigma", "input_max", "output_median",
                         "output_sigma", "output_max"]}[args.dataset]
    return {"name": args.dataset, "prompt_kind": args.prompt_kind, "seed": args.seed,
            **{k: getattr(args, k) for k in keys}}


def print_run(r: dict) -> None:
    rate = r["request_rate"]
    print(f"== {r['label']} {r['model']} {r['endpoint']} rate {rate} "
          f"({r['num_prompts']} requests, {r['dataset']['name']}) ==")
    print(f"completed {r['completed']}, failed {r['failed']}, {r['duration_s']:.2f} s: "
          f"{r['request_throughput']:.2f} req/s, {r['output_throughput']:.0f} output tok/s, "
          f"{r['total_token_throughput']:.0f} tok/s in all"
          + (f", goodput {r['request_goodput']:.2f} req/s" if r["goodput_slos_ms"] else ""))
    print(f"{'ms':6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2el"):
        row = r[f"{name}_ms"]
        print(f"{name.upper():6}" + "".join(
            f"{row[k]:10.2f}" if row[k] is not None else f"{'-':>10}"
            for k in ("mean", "p50", "p90", "p99")))
    lag = r["send_lag_ms"]
    print(f"send lag p50 {lag['p50']:.2f} ms, p99 {lag['p99']:.2f} ms; "
          f"output tokens from {r['output_tokens_from']}: {r['total_output_tokens']} "
          f"(asked for {r['expected_output_tokens']})" + (
              f"; errors {r['errors']}" if r["errors"] else ""))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--base-url", default="http://127.0.0.1:8000")
    a("--endpoint", default="/v1/chat/completions",
      choices=["/v1/chat/completions", "/v1/completions"])
    a("--model", help="the `model` of each request (default: the server's first)")
    a("--label", default="server", help="the system's name in the results")
    a("--tag", default="", help="a free-form name of the set-up (e.g. the model shape)")
    a("--tokenizer", help="the served model's tokenizer.json (or its folder): exact prompt "
      "lengths, and output tokens counted from the text where the server sends no usage")
    a("--dataset", default="random", choices=["random", "shared-prefix", "sharegpt"])
    a("--prompt-kind", default="ids", choices=["ids", "words"],
      help="random token ids decoded (needs --tokenizer), or English words")
    a("--input-len", type=int, default=1024, help="random; shared-prefix: the question")
    a("--output-len", type=int, default=128)
    a("--range-ratio", type=float, default=0.0, help="random: lengths in L*(1 -+ r)")
    a("--groups", type=int, default=8, help="shared-prefix: system prompts")
    a("--system-len", type=int, default=2048, help="shared-prefix: system prompt tokens")
    a("--input-median", type=float, default=200)
    a("--input-sigma", type=float, default=1.0)
    a("--input-max", type=int, default=4096)
    a("--output-median", type=float, default=150)
    a("--output-sigma", type=float, default=0.8)
    a("--output-max", type=int, default=1024)
    a("--num-prompts", type=int, default=400, help="requests per rate")
    a("--duration", type=float, default=0.0, help="at a finite rate send only "
      "ceil(rate * duration) requests (at least --min-prompts); 0: --num-prompts")
    a("--min-prompts", type=int, default=32)
    a("--request-rates", default="inf",
      help="comma-separated req/s; inf: all at once; empty: only --warmup")
    a("--max-concurrency", type=int, help="most requests in flight")
    a("--client-procs", type=int, default=1, help="client processes sharing the schedule")
    a("--warmup", type=int, default=0, help="unmeasured requests first (all at once)")
    a("--temperature", type=float, default=0.0)
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    a("--records", help="append each measured request here, one JSON line (write_records)")
    a("--goodput", nargs="*", default=[], metavar="NAME:MS", help="SLOs: ttft, tpot, e2el")
    a("--seed", type=int, default=0)
    a("--request-timeout", type=float, default=600.0, help="seconds per request")
    a("--deadline", type=float, help="start no rate after this many seconds")
    a("--json", help="append one JSON line per rate to this file")
    return p


def checked_args() -> tuple[argparse.Namespace, list[float]]:
    """The flags, refused with the flag and its limit before any request is sent."""
    p = parser()
    args = p.parse_args()
    try:
        rates = [float(r) for r in args.request_rates.split(",") if r]  # "": warm-up only
    except ValueError:
        p.error(f"--request-rates takes req/s numbers or inf, comma-separated; "
                f"got {args.request_rates!r}")
    try:
        parse_goodput(args.goodput)
    except ValueError as e:
        p.error(str(e))
    for name, low in [("num_prompts", 1), ("min_prompts", 1), ("client_procs", 1),
                      ("warmup", 0), ("max_concurrency", 1), ("output_len", 1)]:
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}; got {value}")
    if any(not r > 0 for r in rates):
        p.error(f"--request-rates must be > 0 (or inf); got {args.request_rates}")
    return args, rates


def main() -> None:
    args, rates = checked_args()
    tok = load_tokenizer(args.tokenizer)
    count = (lambda text: len(tok.encode(text, add_special_tokens=False).ids)) if tok else None
    model = args.model or served_model(args.base_url)
    t0 = time.perf_counter()
    if args.warmup:
        warm = run_once(args, model, make_requests(args, tok, args.warmup, args.seed + 10_000),
                        math.inf, 0, count)
        print(f"warm-up: {warm['completed']} of {args.warmup} completed in "
              f"{warm['duration_s']:.1f} s" + (f"; errors {warm['errors']}" if warm["errors"]
                                               else ""), flush=True)
    for k, rate in enumerate(rates):
        if args.deadline is not None and time.perf_counter() - t0 > args.deadline:
            print(f"rate {rate}: skipped, past the --deadline of {args.deadline} s")
            continue
        reqs = make_requests(args, tok, prompts_for(args, rate), args.seed + k)
        result = {"label": args.label, "tag": args.tag, "model": model,
                  "endpoint": args.endpoint, "request_rate": rate,
                  "max_concurrency": args.max_concurrency, "num_prompts": len(reqs),
                  "client_procs": args.client_procs, "dataset": describe(args),
                  "prompts_sha256": ds.fingerprint(reqs), "time": time.time()}
        result.update(run_once(args, model, reqs, rate, args.seed + k, count, args.records))
        print_run(result)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
