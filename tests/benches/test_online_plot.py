"""benches/online/online_plot.py: PNGs per model shape and the side-by-side table with ratios."""

import json
import math
from pathlib import Path

from online_plot import load, plot, table


def run(label: str, rate: float, ttft: float, tpot: float, tok_s: float, sha: str) -> dict:
    stats = lambda v: {"mean": v, "p50": v, "p90": v * 1.5, "p99": v * 2}
    return {"label": label, "tag": "qwen3-0.6b", "model": "m", "request_rate": rate,
            "completed": 10, "failed": 0, "prompts_sha256": sha, "ttft_ms": stats(ttft),
            "tpot_ms": stats(tpot), "itl_ms": stats(tpot), "e2el_ms": stats(ttft + 100 * tpot),
            "output_throughput": tok_s}


def test_plots_and_table_compare_each_rate_with_the_baseline(tmp_path: Path) -> None:
    runs = [run("minisgl", 4.0, 40.0, 5.0, 500.0, "a"),
            run("mini-sglang", 4.0, 50.0, 6.0, 400.0, "a"),
            run("minisgl", math.inf, 400.0, 9.0, 9000.0, "b"),
            run("mini-sglang", math.inf, 500.0, 10.0, 6000.0, "c")]
    path = tmp_path / "online.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    (tag, by_label), = load([str(path)]).items()
    assert tag == "qwen3-0.6b" and set(by_label) == {"minisgl", "mini-sglang"}
    rows = table(tag, by_label, baseline="mini-sglang")
    row = "| 4 | minisgl | 10 / 0 | 40.0 | 80.0 | 5.0 | 10.0 | 540.0 | 500 | 0.80x, 0.83x, 1.25x |"
    assert row in rows
    assert any(r.startswith("| inf | minisgl") and "(other prompts: not comparable)" in r
               for r in rows)
    for png in plot(tag, by_label, tmp_path):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
