"""Plots and a table from benches/online.py's JSON lines, one set per --tag (model shape):

    python benches/online_plot.py $OUT/online.jsonl --out benches/plots --baseline mini-sglang

- TAG-latency.png: TTFT p50, TTFT p99 and TPOT p50 against the request rate, one line per
  system (--label of each run);
- TAG-throughput.png: output tokens/s against the request rate.
The table printed (markdown) has each rate's figures per system and, with --baseline, each
system's ratio to the baseline's. A run whose prompts differ from the baseline's at the same
rate (prompts_sha256) is flagged: their figures are not comparable. Where several runs share
a tag, system and rate, the last one counts."""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

Runs = dict[str, dict[float, dict]]  # label -> rate -> run


def load(paths: list[str]) -> dict[str, Runs]:
    by_tag: dict[str, Runs] = defaultdict(lambda: defaultdict(dict))
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by_tag[r.get("tag") or r["model"]][r["label"]][r["request_rate"]] = r
    return by_tag


def rate_name(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def plot(tag: str, runs: Runs, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({rate for by_rate in runs.values() for rate in by_rate})
    x = {rate: i for i, rate in enumerate(rates)}  # evenly spaced; `inf` is the last

    def lines(ax, metric: str, key: str | None, title: str, unit: str) -> None:
        for label, by_rate in sorted(runs.items()):
            pts = sorted(by_rate)
            ys = [by_rate[r][metric][key] if key else by_rate[r][metric] for r in pts]
            ax.plot([x[r] for r in pts], ys, marker="o", label=label)
        ax.set_xticks(range(len(rates)), [rate_name(r) for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend()

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    lines(axes[0], "ttft_ms", "p50", "TTFT p50", "ms")
    lines(axes[1], "ttft_ms", "p99", "TTFT p99", "ms")
    lines(axes[2], "tpot_ms", "p50", "TPOT p50", "ms")
    fig.suptitle(f"{tag}: latency under load")
    fig.tight_layout()
    latency = out / f"{tag}-latency.png"
    fig.savefig(latency, dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    lines(ax, "output_throughput", None, f"{tag}: output throughput", "output tokens/s")
    fig.tight_layout()
    throughput = out / f"{tag}-throughput.png"
    fig.savefig(throughput, dpi=110)
    plt.close("all")
    return [latency, throughput]


def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def ms(run: dict, metric: str, key: str) -> str:
    return f"{run[metric][key]:.1f}" if run[metric][key] is not None else "-"


def table(tag: str, runs: Runs, baseline: str | None) -> list[str]:
    base = runs.get(baseline or "", {})
    rows = [f"### {tag}", "",
            "| rate | system | done / failed | TTFT p50 | TTFT p99 | TPOT p50 | ITL p99 | "
            "E2E p50 | output tok/s | vs " + (baseline or "-") + " (TTFT p50, TPOT p50, "
            "tok/s) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    rates = sorted({rate for by_rate in runs.values() for rate in by_rate})
    for rate in rates:
        for label, by_rate in sorted(runs.items()):
            if rate not in by_rate:
                continue
            r, b = by_rate[rate], base.get(rate)
            vs = "-"
            if b is not None and label != baseline:
                vs = ", ".join([ratio(r["ttft_ms"]["p50"], b["ttft_ms"]["p50"]),
                                ratio(r["tpot_ms"]["p50"], b["tpot_ms"]["p50"]),
                                ratio(r["output_throughput"], b["output_throughput"])])
                if r["prompts_sha256"] != b["prompts_sha256"]:
                    vs += " (other prompts: not comparable)"
            figures = [ms(r, "ttft_ms", "p50"), ms(r, "ttft_ms", "p99"), ms(r, "tpot_ms", "p50"),
                       ms(r, "itl_ms", "p99"), ms(r, "e2el_ms", "p50")]
            rows.append(f"| {rate_name(rate)} | {label} | {r['completed']} / {r['failed']} | "
                        + " | ".join(figures) + f" | {r['output_throughput']:.0f} | {vs} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", help="benches/online.py --json files")
    p.add_argument("--out", type=Path, default=Path("."), help="folder for the PNGs")
    p.add_argument("--baseline", help="the --label the others are compared with")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for tag, runs in sorted(load(args.jsonl).items()):
        print("\n".join(table(tag, runs, args.baseline)) + "\n")
        if not args.no_plots:
            for png in plot(tag, runs, args.out):
                print(f"wrote {png}")


if __name__ == "__main__":
    main()
