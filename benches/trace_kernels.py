"""GPU kernels of a torch.profiler Chrome trace, per step (benches/step_profile.py --trace):

    python benches/trace_kernels.py trace.json[.gz] --steps 5

Sums each kernel's duration over the trace and divides by the number of steps profiled;
"gap before" is the mean idle time between the previous kernel's end and this one's start
(gaps of 50 us or more, between steps, are left out). Runs anywhere: plain JSON.

    python benches/trace_kernels.py trace.json.gz --between _gumbel_argmax_kernel RMSNormKernel

lists instead what runs between two steps: from the end of the kernel before each FIRST
(the LM head, before the sampler and its copies) to the next LAST (the next step's first norm), each
launch with its idle gap, and the span, launches and busy time of each such stretch."""

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
    p.add_argument("--between", nargs=2, metavar=("FIRST", "LAST"),
                   help="list the launches between steps (see above) instead")
    args = p.parse_args()
    events = kernel_events(args.trace)
    if args.between:
        between_steps(events, *args.between)
        return
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


def between_steps(events: list[dict], first: str, last: str) -> None:
    starts = [i for i, e in enumerate(events) if first in e["name"] and i > 0]
    for i in starts:
        end = next((j for j in range(i, len(events)) if last in events[j]["name"]), None)
        if end is None:
            break
        while i > 1 and events[i - 1]["cat"] != "kernel":  # copies before FIRST count too
            i -= 1
        t0 = events[i - 1]["ts"] + events[i - 1]["dur"]
        stretch, busy, prev = events[i:end], 0.0, t0
        print(f"\nafter `{events[i - 1]['name'][:60]}`:")
        for e in stretch:
            print(f"  +{e['ts'] - t0:7.1f} us  gap {e['ts'] - prev:5.1f}  dur {e['dur']:6.1f}  "
                  f"{e['name'][:80]}")
            busy, prev = busy + e["dur"], e["ts"] + e["dur"]
        print(f"  {events[end]['ts'] - t0:.1f} us to `{events[end]['name'][:40]}`: "
              f"{len(stretch)} launches, {busy:.1f} us busy")


if __name__ == "__main__":
    main()
