"""`minisgl-router --shell` in a real terminal: driven through a pseudo-terminal with pexpect
(so rustyline edits lines in raw mode and Ctrl-C is the terminal's SIGINT), against the
default model. The tests run in order on one shell; the last one quits it."""

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest

from tests.e2e.conftest import (
    READY_TIMEOUT_S,
    descendants,
    free_port,
    still_alive,
    wait_idle,
    worker_metrics,
)

pytestmark = pytest.mark.slow

PROMPT = ">>> "
ANSWER = "The capital of France is Paris."
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
ROUTER = str(Path(sys.executable).parent / "minisgl-router")


@dataclass
class Shell:
    child: pexpect.spawn
    base_url: str

    def run(self, line: str, timeout_s: float = 180) -> str:
        """Types a line; what the shell printed before its next prompt (escapes removed,
        the echoed line dropped)."""
        self.child.sendline(line)
        self.child.expect_exact(PROMPT, timeout=timeout_s)
        out = ESCAPES.sub("", self.child.before)
        return out.split("\n", 1)[1].strip() if "\n" in out else ""

    def answer(self, question: str) -> str:
        """The answer's text; its stats line must follow it."""
        out = self.run(question)
        text, _, stats = out.rpartition("\n")
        assert re.fullmatch(r"\[TTFT \d+\.\d\d s( · \d+\.\d tok/s)? · \d+ tokens\]", stats), out
        return text


def spawn(*args: str) -> pexpect.spawn:
    return pexpect.spawn(ROUTER, list(args), encoding="utf-8", timeout=READY_TIMEOUT_S,
                         dimensions=(50, 250), env={**os.environ, "TERM": "xterm"})


@pytest.fixture(scope="module")
def shell() -> Iterator[Shell]:
    port = free_port()
    child = spawn("--shell", "--port", str(port))
    child.expect(r"minisgl shell: SmolLM2-135M-Instruct at http://127\.0\.0\.1:\d+")
    child.expect_exact(PROMPT)
    shell = Shell(child, f"http://127.0.0.1:{port}")
    assert shell.run("/set temperature 0") == "[temperature 0]"
    assert shell.run("/set max_tokens 48") == "[max_tokens 48]"
    yield shell
    if child.isalive():
        child.terminate(force=True)


def test_turns_depend_on_each_other_and_reset_forgets(shell: Shell) -> None:
    assert shell.answer("What is the capital of France?") == ANSWER
    assert shell.answer("Repeat your last answer.") == ANSWER  # it saw the first turn
    assert shell.run("/reset") == "[conversation cleared]"
    assert ANSWER not in shell.answer("Repeat your last answer.")


def test_ctrl_c_stops_an_answer_and_frees_its_kv(shell: Shell) -> None:
    shell.run("/reset")
    shell.run("/set max_tokens 2000")
    before = worker_metrics(shell.base_url)["generation_tokens_total"]
    shell.child.sendline("Write a long story about a dragon who learns to fly.")
    shell.child.expect_exact("fly.")  # the echo
    shell.child.expect(r"\w+ \w+ \w+ \w+", timeout=120)  # the answer is streaming
    assert worker_metrics(shell.base_url)["num_requests_running"] == 1
    shell.child.sendintr()
    shell.child.expect_exact("[stopped]", timeout=10)
    shell.child.expect_exact(PROMPT)
    after = wait_idle(shell.base_url, timeout_s=10)  # aborted in the worker: slot and KV free
    assert after["generation_tokens_total"] - before < 500
    assert shell.child.isalive()
    shell.run("/set max_tokens 48")
    assert shell.answer("What is the capital of France?") == ANSWER


def test_a_second_shell_attaches_with_url_and_quits_on_ctrl_d(shell: Shell) -> None:
    other = spawn("--shell", "--url", shell.base_url)
    other.expect_exact(f"minisgl shell: SmolLM2-135M-Instruct at {shell.base_url}",
                       timeout=30)
    other.expect_exact(PROMPT)
    attached = Shell(other, shell.base_url)
    attached.run("/set temperature 0")
    assert attached.answer("What is the capital of France?") == ANSWER
    assert descendants(other.pid) == set()  # it started no workers
    other.sendeof()
    other.expect(pexpect.EOF, timeout=10)
    other.close()
    assert other.exitstatus == 0
    assert shell.child.isalive()  # the server it talked to goes on


def test_exit_shuts_everything_down(shell: Shell) -> None:
    pid = shell.child.pid
    workers = descendants(pid)
    assert workers, "the shell's server should have spawned a worker"
    shell.child.sendline("/exit")
    shell.child.expect(pexpect.EOF, timeout=60)
    shell.child.close()
    assert shell.child.exitstatus == 0, ESCAPES.sub("", shell.child.before or "")
    assert not still_alive(workers, within_s=10), "worker processes outlived the shell"
    assert not list(Path("/tmp").glob(f"minisgl-{pid}-*.sock"))
