"""benches/online/online.py against the real router and default model: every request completes,
the output-token count is the server's usage and what ignore_eos asked for, and prompts of
random token ids are exactly the drawn lengths under the model's tokenizer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from minisgl_worker.default_model import ensure_default_model

from tests.e2e.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
DATASET = ["--input-len", "24", "--output-len", "4", "--range-ratio", "0.5"]


def bench(server: Server, tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "online.jsonl"
    cmd = [sys.executable, str(ROOT / "benches/online/online.py"), "--base-url", server.base_url,
           "--tokenizer", ensure_default_model(), *DATASET, "--num-prompts", "3",
           "--json", str(out), *args]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def drawn(n: int, seed: int) -> tuple[int, str]:
    """(prompt tokens, fingerprint) of the requests the bench draws with these flags."""
    sys.path.insert(0, str(ROOT / "benches" / "online"))
    import online

    args = online.parser().parse_args(["--tokenizer", ensure_default_model(), *DATASET])
    reqs = online.make_requests(args, online.load_tokenizer(args.tokenizer), n, seed)
    return sum(r.prompt_len for r in reqs), online.ds.fingerprint(reqs)


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_online_bench_streams_every_request(server: Server, tmp_path: Path,
                                            endpoint: str) -> None:
    (run,) = bench(server, tmp_path, "--endpoint", endpoint, "--request-rates", "inf",
                   "--goodput", "ttft:600000")
    assert (run["completed"], run["failed"]) == (3, 0), run["errors"]
    assert run["output_tokens_from"] == {"usage": 3}
    assert run["total_output_tokens"] == run["expected_output_tokens"]  # ignore_eos honored
    assert 0 < run["ttft_ms"]["p50"] <= run["e2el_ms"]["p50"]
    assert run["tpot_ms"]["p50"] > 0 and run["itl_ms"]["p99"] > 0
    assert run["request_goodput"] == pytest.approx(run["request_throughput"])
    tokens, fingerprint = drawn(3, seed=0)
    assert run["prompts_sha256"] == fingerprint
    if endpoint == "/v1/completions":  # usage counts the prompt as drawn: lengths are exact
        assert run["total_input_tokens"] == tokens


def test_online_bench_at_a_rate_with_two_client_processes(server: Server,
                                                          tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    (run,) = bench(server, tmp_path, "--endpoint", "/v1/completions", "--request-rates", "20",
                   "--client-procs", "2", "--seed", "5", "--warmup", "2",
                   "--records", str(records))
    assert (run["completed"], run["failed"]) == (3, 0), run["errors"]
    assert (run["request_rate"], run["client_procs"]) == (20.0, 2)
    assert 0 <= run["send_lag_ms"]["p50"] <= run["send_lag_ms"]["p99"]  # sent on schedule
    assert run["total_output_tokens"] == run["expected_output_tokens"]
    assert run["total_input_tokens"] == drawn(3, seed=5)[0]
    # One record per measured request (not the warm-up's), its times in order.
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == 3 and {r["rate"] for r in rows} == {20.0}
    for r in rows:
        assert r["error"] is None, r
        assert 0 <= r["sent_ms"] < r["first_ms"] <= r["end_ms"], r
        assert r["max_gap_ms"] is not None and 0 <= r["max_gap_ms"] <= r["end_ms"], r
    assert sum(r["prompt"] for r in rows) == run["total_input_tokens"]
    assert sum(r["output"] for r in rows) == run["total_output_tokens"]
