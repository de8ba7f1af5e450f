"""Routing policies on one GPU: two workers sharing it (half the KV each), cache_aware
against round_robin on a shared-prefix workload, and one worker holding everything.

`groups` x `per_group` requests; a group's requests share a `prefix_len`-token prefix
(random token ids) and add `suffix_len` of their own, generating `output_len` tokens
(ignore_eos). They are interleaved (request j of every group, then j + 1: consecutive
requests never share a prefix) and sent at once, `concurrency` in flight, to
`minisgl-router --workers 2 --kv-tokens K` with both workers on GPU 0. K defaults to what
holds `fit` prefixes (the whole set needs `groups`): round_robin makes each worker hold
every prefix and thrash, cache_aware keeps each prefix on one worker. `single` is one
worker with 2K tokens, the hit rate to match. Reported per run: wall time, requests/s,
prompt and output tokens/s, the cached share of the prompt tokens (usage.cached_tokens,
the workers' report), the share the router's prefix index predicted when it sent each
request, and the requests where the two differed (/metrics, minisgl_prefix_index_*).

    H200:  python benches/routing.py --model DIR --load-format dummy   (random weights in
           DIR's shape, e.g. a folder from benches/online/random_model.py)
    CPU:   python benches/routing.py --small --device cpu   (a quick check that it runs)

Writes $OUT/routing.json when OUT is set; prints a markdown table last."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from common import launch_router

SMALL = {
    "groups": 8,
    "per_group": 2,
    "prefix_len": 256,
    "suffix_len": 8,
    "output_len": 4,
    "fit": 5,
    "concurrency": 8,
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="HF-style folder (default: the embedded default model)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--load-format", choices=["safetensors", "dummy"],
                   help="the workers' weights (their default: the folder's safetensors)")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--per-group", type=int, default=8)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--fit", type=int, default=40, help="prefixes one worker's KV holds")
    p.add_argument("--kv-tokens", type=int, default=0, help="per worker; 0: from --fit")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--run", action="append", dest="runs", metavar="'POLICY [FLAGS]'",
                   help="a run: a routing policy (or single) and router flags, e.g. "
                        "'cache_aware --balance-abs-threshold 64' (repeatable; default: "
                        "cache_aware, round_robin, single)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="CPU quick check: " + str(SMALL))
    args = p.parse_args()
    args.runs = args.runs or ["cache_aware", "round_robin", "single"]
    if args.small:
        for key, value in SMALL.items():
            setattr(args, key, value)
    if not args.kv_tokens:
        args.kv_tokens = args.fit * (args.prefix_len + args.suffix_len + args.output_len)
    return args


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    """Interleaved: position j * groups + g is request j of group g."""
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randint(100, 10000) for _ in range(n)]
    prefixes = [ids(args.prefix_len) for _ in range(args.groups)]
    return [
        prefixes[g] + ids(args.suffix_len)
        for _ in range(args.per_group)
        for g in range(args.groups)
    ]


def start_router(args: argparse.Namespace, workers: int, policy: str, flags: list[str],
                 log: Path) -> tuple[subprocess.Popen, str]:
    cmd = ["--workers", str(workers), "--device", args.device, "--routing-policy", policy,
           "--kv-tokens", str(args.kv_tokens * (3 - workers)), *flags]
    if args.model:
        cmd += ["--model", args.model]
    if args.load_format:
        cmd += ["--load-format", args.load_format]
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
    }  # both workers on one GPU
    return launch_router(cmd, log, 900, env)


def model_name(url: str) -> str:
    return requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def run_one(args: argparse.Namespace, run: str, prompts: list[list[int]], log: Path) -> dict:
    name, *flags = run.split()
    workers, policy = (1, "cache_aware") if name == "single" else (2, name)
    proc, url = start_router(args, workers, policy, flags, log)
    try:
        model = model_name(url)

        def send(prompt: list[int]) -> dict[str, Any]:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": args.output_len,
                "ignore_eos": True,
                "temperature": 0,
            }
            r = requests.post(f"{url}/v1/completions", json=body, timeout=3600)
            r.raise_for_status()
            return r.json()["usage"]

        send(prompts[0][: args.suffix_len])  # warm-up, shares no prefix
        before = counters(url)
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            usages = list(pool.map(send, prompts))
        wall = time.perf_counter() - start
        index = {k: v - before[k] for k, v in counters(url).items()}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    output = sum(u["completion_tokens"] for u in usages)
    return {
        "run": run,
        "workers": workers,
        "kv_tokens_per_worker": args.kv_tokens * (3 - workers),
        "wall_s": round(wall, 2),
        "req_per_s": round(len(prompts) / wall, 2),
        "prompt_tok_per_s": round(prompt / wall),
        "output_tok_per_s": round(output / wall),
        "hit_rate": round(cached / prompt, 3),
        # What the router's index predicted when it sent each request, and for how many
        # requests that differed from the worker's report (requests overlapping on a
        # worker: one sent while the prefix it will reuse is still being computed).
        "index_hit_rate": round(index["predicted_tokens"] / prompt, 3),
        "index_mismatches": int(index["mismatches"]),
        # Which rule of the policy sent the requests (minisgl_routing_decisions_total).
        "decisions": {r: int(index[r]) for r in REASONS if index[r]},
    }


REASONS = ("prefix", "spread", "balance", "policy")


def counters(url: str) -> dict[str, float]:
    """The prefix index's counters and the routing decisions by reason from /metrics,
    summed over the workers."""
    lines = requests.get(f"{url}/metrics", timeout=10).text.splitlines()

    def total(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))

    totals = {name: total(f"minisgl_prefix_index_{name}_total{{")
              for name in ("requests", "predicted_tokens", "reported_tokens", "mismatches")}
    for reason in REASONS:
        series = "minisgl_routing_decisions_total{"
        totals[reason] = sum(
            float(line.rsplit(" ", 1)[1]) for line in lines
            if line.startswith(series) and f'reason="{reason}"' in line
        )
    return totals


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| run | workers | KV tokens each | wall s | req/s | prompt tok/s | output tok/s "
            "| hit rate | index hit rate | index mismatches | decisions |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['workers']} | {r['kv_tokens_per_worker']} | "
            f"{r['wall_s']} | {r['req_per_s']} | {r['prompt_tok_per_s']} | "
            f"{r['output_tok_per_s']} | {r['hit_rate']:.1%} | {r['index_hit_rate']:.1%} | "
            f"{r['index_mismatches']} | "
            + ", ".join(f"{k} {v}" for k, v in r["decisions"].items()) + " |"
        )
    base = next((r for r in rows if r["run"] == "round_robin"), None)
    for r in rows:
        if base and r["run"].startswith("cache_aware"):
            speedup = base["wall_s"] / r["wall_s"]
            lines.append(f"\n{r['run']} / round_robin throughput: {speedup:.2f}x")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    prompts = make_prompts(args)
    out = Path(os.environ.get("OUT", "/tmp"))
    rows = []
    for i, run in enumerate(args.runs):
        log = out / f"routing-{i}-{run.split()[0]}.log"
        rows.append(run_one(args, run, prompts, log))
        print(json.dumps(rows[-1]), flush=True)
    if "OUT" in os.environ:
        (out / "routing.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
