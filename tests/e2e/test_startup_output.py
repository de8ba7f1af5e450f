"""What a person sees while the server starts: one line per stage with its time and a ready
line naming the chat page and the API, and no progress bars where stderr is not a terminal
(CI logs, files, pipes); on a terminal the bars show."""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from minisgl_worker.default_model import ensure_default_model
from safetensors.torch import load_file, save_file

from tests.e2e.conftest import Server, launch_router

STAGES = [  # in the order they happen
    r"\[worker 0\] .* model loaded in \d+\.\d s \(135M parameters",
    r"\[worker 0\] .* KV cache sized in \d+\.\d s \([\d,]+ tokens of float32\)",
    r"1 worker\(s\) ready in \d+\.\d s",
    r"ready: chat page (http://127\.0\.0\.1:\d+)/ , API (http://127\.0\.0\.1:\d+)/v1",
]


def test_one_line_per_stage_and_no_bars_in_a_pipe(server: Server) -> None:
    log = server.log_path.read_text()  # the shared router's stdout and stderr, a file
    assert "\r" not in log, "a progress bar wrote carriage returns to a file"
    assert "it/s]" not in log and "%|" not in log, "a progress bar wrote to a file"
    position = 0
    for stage in STAGES:
        match = re.compile(stage).search(log, position)
        assert match, f"no line matching {stage!r} after offset {position}:\n{log[:3000]}"
        position = match.end()
    page, api = match.groups()
    assert page == api == server.base_url, (page, api, server.base_url)


BAR = "from minisgl_worker.startup import progress; list(progress(range(3), 'stage', 'step'))"


def run_bar(stderr_is_tty: bool) -> str:
    """What a three-step bar writes to stderr, a pseudo-terminal or a pipe."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if not stderr_is_tty:
        done = subprocess.run([sys.executable, "-c", BAR], capture_output=True, env=env,
                              timeout=60, check=True)
        return done.stderr.decode()
    leader, follower = pty.openpty()
    # 24 rows x 80 columns, as a terminal has (a new pty is 0 x 0: no room for a bar).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", BAR], stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the pty closes when the process exits (EIO)
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_progress_bars_only_on_a_terminal() -> None:
    assert "stage: 100%" in run_bar(stderr_is_tty=True)
    assert run_bar(stderr_is_tty=False) == ""


def failed_start(tmp_path: Path, *args: str) -> str:
    """Starts the router with `args`, which must fail -> its log (no traceback in it)."""
    server = launch_router(tmp_path, *args)
    try:
        code = server.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise
    log = server.log_path.read_text()
    assert code != 0, log
    assert "Traceback" not in log, log
    return log


@pytest.mark.parametrize(("breaks", "says"), [
    ("config", ("{folder}/config.json: model_type 'mixtral' is not supported (supported: "
     "llama, mistral, qwen2, qwen3)")),
    ("weights", ("{folder} does not hold the model its config.json describes: "
     "model.norm.weight is missing")),
])
def test_a_model_we_cannot_serve_stops_the_start_with_one_line_naming_the_field(
        tmp_path: Path, breaks: str, says: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    default = Path(ensure_default_model())
    for file in default.iterdir():
        if file.name not in ("config.json", "model.safetensors"):
            (folder / file.name).symlink_to(file)
    config = json.loads((default / "config.json").read_text())
    weights = load_file(default / "model.safetensors")
    if breaks == "config":
        config["model_type"] = "mixtral"
    else:
        del weights["model.norm.weight"]
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, folder / "model.safetensors")
    log = failed_start(tmp_path, "--model", str(folder))
    assert f"minisgl_worker: error: {says.format(folder=folder)}" in log, log


def test_a_kv_cache_larger_than_memory_stops_the_start_with_one_line(tmp_path: Path) -> None:
    log = failed_start(tmp_path, "--model", ensure_default_model(), "--kv-tokens", str(10**15))
    assert "minisgl_worker: error: --kv-tokens 1,000,000,000,000,000 needs " in log, log
    assert "left for it in host memory (available, shared by 1 rank(s)): at most " in log, log
