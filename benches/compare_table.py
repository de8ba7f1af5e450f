"""The side-by-side table from one device call's bench.jsonl (lines appended by
benches/offline.py and benches/minisgl_offline.py; see scripts/gpu-compare):

    python benches/compare_table.py $OUT/bench.jsonl

One row per model shape and scheduler setting of ours (benches/offline.py --configs):
each of our repetitions, each of mini-sglang's runs (one fresh process each), and the ratio
of our mean throughput to mini-sglang's best run: its first process on a machine can run the
small model ~30% slower than the next (seen on the H200), so its best is the fair figure."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", help="the call's bench.jsonl")
    args = p.parse_args()
    ours: dict[tuple[str, str], list[float]] = defaultdict(list)
    ref: dict[str, list[float]] = defaultdict(list)
    for line in Path(args.jsonl).read_text().splitlines():
        r = json.loads(line)
        name = Path(r["model"]).name
        if r.get("engine") == "mini-sglang":
            ref[name].append(r["tok_s"])
        else:
            ours[name, r.get("config", "-")].append(r["tok_s"])
    print("| model shape | our scheduler | minisgl tok/s (each rep) | mini-sglang tok/s "
          "(each run) | ratio (our mean / its best) |")
    print("| --- | --- | ---: | ---: | ---: |")
    benched = {name for name, _ in ours}
    rows = sorted([*ours, *((name, "-") for name in ref if name not in benched)])
    for name, config in rows:
        mine, theirs = ours.get((name, config), []), ref.get(name, [])
        ratio = (f"{sum(mine) / len(mine) / max(theirs):.3f}x"
                 if mine and theirs else "-")
        print(f"| {name} | {config} | {' / '.join(f'{x:,.0f}' for x in mine) or '-'} | "
              f"{' / '.join(f'{x:,.0f}' for x in theirs) or '-'} | {ratio} |")


if __name__ == "__main__":
    main()
