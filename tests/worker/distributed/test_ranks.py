"""LocalRanks, the ranks a worker's first process spawns: a rank that exits takes the group
down, unless the group is shutting down (every rank got Shutdown), when a rank that ends its
teardown first is expected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys, time
from minisgl_worker.distributed.ranks import LocalRanks

def exit_at_once(rank):
    pass  # as a rank that got Shutdown and finished its teardown first

if __name__ == "__main__":
    ranks = LocalRanks(exit_at_once, (), range(1, 2))
    if sys.argv[1] == "shutting-down":
        ranks.expect_exits()
    ranks.start()
    deadline = time.monotonic() + 30
    while ranks.procs[0].exitcode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)  # the watch looks every 0.2 s
    ranks.stop(grace_s=1)
    print("rank 0 finished its teardown")
"""


@pytest.mark.parametrize(("state", "code"), [("serving", 1), ("shutting-down", 0)])
def test_a_rank_that_exits_takes_the_group_down_unless_it_is_shutting_down(
        tmp_path: Path, state: str, code: int) -> None:
    script = tmp_path / "group.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script), state], capture_output=True, text=True,
                          check=False,
                          env=env, timeout=60)
    assert done.returncode == code, done.stderr
    assert ("rank 0 finished its teardown" in done.stdout) == (code == 0), done.stdout
    assert ("taking the group down" in done.stderr) == (code == 1), done.stderr
