"""A soak: N minutes of steady mixed load on one real router (the default model on CPU unless
told otherwise), then what leaked.

    .venv/bin/python benches/online/soak.py --minutes 30      # the issue's run
    .venv/bin/python benches/online/soak.py --minutes 2       # a quick check

`--clients` threads each loop until the time is up, drawing one of:
  stream  a streamed chat completion read to its `[DONE]` (finish_reason set, usage sent);
  whole   a non-streamed completion (status 200, the tokens asked for or a stop);
  cancel  a streamed chat completion whose connection is closed after 0-3 chunks;
  bad     a request the router must refuse (a wrong type, an unknown field, a malformed
          body, an unknown model): a 4xx in OpenAI's error shape;
  constrained  a chat completion under a JSON schema, a regex or a required tool call,
          streamed or whole, a third of the streams closed after 0-3 chunks: an answer that
          stopped must follow its constraint (JSON that validates, the regex, a tool call
          whose arguments parse).
Anything else is an unexpected failure: a 5xx, a dropped stream, a timeout, a wrong status.

Every `--sample-s` seconds the router's and its workers' resident memory (/proc) is read.
Growth is measured from the end of the warm-up (`--warmup-min`, default a tenth of the run)
to the end of the run. At the end the load stops and `minisgl_kv_cache_used_tokens` must
come back to 0 on every worker. Exit status 1 when there were unexpected failures, RSS grew
by `--max-growth` (5%) or more, or KV stayed in use. Prints JSON lines and a markdown row."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: common.py
from common import launch_router
from soak_load import Load


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--warmup-min", type=float, help="default: a tenth of --minutes")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--sample-s", type=float, default=10)
    p.add_argument("--max-growth", type=float, default=0.05)
    p.add_argument("--max-tokens", type=int, default=24, help="most tokens a request asks for")
    p.add_argument("--router-arg", action="append", default=[],
                   help="extra router flag (repeatable), e.g. --router-arg=--model=DIR")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.warmup_min is None:
        args.warmup_min = args.minutes / 10
    return args


def tree(pid: int) -> list[int]:
    """`pid` and every live process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, stack = [pid], [pid]
    while stack:
        for child in parents.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
    return kb / 1024


def memory(router: int) -> dict[str, float]:
    """Resident MiB of the router and of its workers (every process below it, summed)."""
    below = tree(router)[1:]
    return {"router_mib": round(rss_mib(router), 1),
            "workers_mib": round(sum(rss_mib(p) for p in below), 1)}


def kv_used(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("minisgl_kv_cache_used_tokens{"))


def settle_kv(url: str, timeout_s: float = 60) -> float:
    """KV in use once idle (the workers' `load` reports come every second when idle)."""
    deadline = time.monotonic() + timeout_s
    used = kv_used(url)
    while used and time.monotonic() < deadline:
        time.sleep(1)
        used = kv_used(url)
    return used


def soak(args: argparse.Namespace, proc: subprocess.Popen, url: str) -> dict:
    model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    start = time.monotonic()
    load = Load(url, model, args, start + args.minutes * 60)
    threads = [threading.Thread(target=load.run, args=(i,), daemon=True)
               for i in range(args.clients)]
    for t in threads:
        t.start()
    samples, warm = [], None
    while any(t.is_alive() for t in threads):
        time.sleep(args.sample_s)
        if proc.poll() is not None:  # the clients' errors say the rest
            load.count("router exited", f"the router exited with {proc.returncode}")
            load.deadline = 0
            break
        sample = {"t_min": round((time.monotonic() - start) / 60, 2), **memory(proc.pid)}
        samples.append(sample)
        print(json.dumps(sample), flush=True)
        if warm is None and sample["t_min"] >= args.warmup_min:
            warm = sample
    for t in threads:
        t.join()
    if not samples:
        raise SystemExit(f"no memory sample: the router exited ({load.failures[:3]})")
    end = samples[-1]
    warm = warm or samples[0]
    growth = {k: round(end[k] / warm[k] - 1, 4) if warm[k] else 0.0
              for k in ("router_mib", "workers_mib")}
    return {"minutes": args.minutes, "clients": args.clients,
            "requests": sum(load.outcomes.values()), "outcomes": dict(load.outcomes),
            "unexpected": len(load.failures), "first_failures": load.failures[:10],
            "rss_after_warmup": warm, "rss_at_end": end,
            "rss_peak": {k: max(s[k] for s in samples) for k in ("router_mib", "workers_mib")},
            "growth": growth,
            "kv_used_at_end": settle_kv(url) if proc.poll() is None else float("nan")}


def main() -> None:
    args = parse_args()
    out = Path(os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    proc, url = launch_router(args.router_arg, out / "soak-router.log", 600)
    try:
        result = soak(args, proc, url)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    print(json.dumps(result, indent=1))
    ok = (result["unexpected"] == 0 and result["kv_used_at_end"] == 0
          and max(result["growth"].values()) < args.max_growth)
    g = result["growth"]
    print(f"| {args.minutes:g} min | {result['requests']} | {result['unexpected']} | "
          f"{result['rss_after_warmup']['router_mib']} -> {result['rss_at_end']['router_mib']} MiB "
          f"({g['router_mib']:+.1%}) | {result['rss_after_warmup']['workers_mib']} -> "
          f"{result['rss_at_end']['workers_mib']} MiB ({g['workers_mib']:+.1%}) | "
          f"{result['kv_used_at_end']:g} | {'pass' if ok else 'FAIL'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
