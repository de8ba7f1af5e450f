"""GPU kernels of a torch.profiler Chrome trace, per step (benches/step_profile.py --trace):

    python benches/trace_kernels.py trace.json[.gz] --steps 5

Sums each kernel's duration over the trace and divides by the number of steps profiled;
"gap before" is the mean idle time between the previous kernel's end and this one's start
(gaps of 50 us or more, between steps, are left out). Runs anywhere: plain JSON."""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

BETWEEN_STEPS_US = 50.0


def kernel_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(gpu, key=lambda e: e["ts"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=5, help="steps the trace covers")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args()
    events = kernel_events(args.trace)
    total, count, gap = defaultdict(float), defaultdict(int), defaultdict(float)
    prev_end, small_gaps = None, 0.0
    for e in events:
        name = e["name"][:70]
        if prev_end is not None and (g := e["ts"] - prev_end) < BETWEEN_STEPS_US:
            gap[name] += max(g, 0.0)
            small_gaps += max(g, 0.0)
        total[name] += e["dur"]
        count[name] += 1
        prev_end = max(prev_end or 0.0, e["ts"] + e["dur"])
    n = args.steps
    print(f"{len(events) / n:.0f} kernels a step, {sum(total.values()) / n:.0f} us of kernels, "
          f"{small_gaps / n:.0f} us of gaps < {BETWEEN_STEPS_US:.0f} us")
    print("| us a step | calls a step | us a call | gap before us | kernel |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {us / n:.1f} | {count[name] / n:.1f} | {us / count[name]:.2f} | "
              f"{gap[name] / count[name]:.2f} | `{name}` |")


if __name__ == "__main__":
    main()
