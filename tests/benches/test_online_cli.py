"""benches/online/online.py refuses bad flags by name and limit before it sends any request."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benches/online/online.py"


@pytest.mark.parametrize(("flags", "message"), [
    (["--num-prompts", "0"], "--num-prompts must be >= 1; got 0"),
    (["--request-rates", "4,0"], "--request-rates must be > 0 (or inf); got 4,0"),
    (["--request-rates", "fast"], "--request-rates takes req/s numbers or inf"),
    (["--goodput", "latency:5"], "--goodput takes NAME:MS with NAME in"),
    (["--max-concurrency", "0"], "--max-concurrency must be >= 1; got 0"),
])
def test_bad_flags_are_refused_by_name(flags: list[str], message: str) -> None:
    # port 9 (discard): were a request sent, it would fail differently
    done = subprocess.run([sys.executable, str(BENCH), "--base-url", "http://127.0.0.1:9",
                           *flags], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
