"""`python -m minisgl_worker` in a subprocess, spoken to over ZeroMQ with protocol.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from minisgl_worker.kvcache.blocks import chain_hashes
from minisgl_worker.protocol import (
    Abort,
    CacheEvents,
    Error,
    ErrorCode,
    Generate,
    Hello,
    Load,
    Msg,
    Ready,
    SamplingParams,
    Shutdown,
    Step,
    decode_frame,
    encode_frame,
)

PYTHON_DIR = Path(__file__).resolve().parents[3] / "python"
TIMEOUT_S = 60


class Client:
    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.address = address

    def send(self, msgs: list[Msg]) -> None:
        self.sock.send(encode_frame(msgs))

    def recv_until(self, done: Any, timeout_s: float = TIMEOUT_S) -> list[Msg]:
        """Every message until done(msg) is true for one (included)."""
        got: list[Msg] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                for msg in decode_frame(self.sock.recv()):
                    got.append(msg)
                    if done(msg):
                        return got
        raise AssertionError(f"timed out; got {got[-5:]}")

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def worker(tiny_llama: tuple[Path, Any], tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Client]]:
    address = f"ipc://{tmp_path}/w.sock"
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), "MINISGL_WORKER_INDEX": "3"}
    cmd = [sys.executable, "-m", "minisgl_worker", "--model", str(tiny_llama[0]),
           "--listen", address, "--kv-tokens", "200", "--page-size", "4", "--device", "cpu"]
    with open(tmp_path / "worker.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stderr=log)
    client = Client(address)
    yield proc, client
    client.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _ready(client: Client) -> Ready:
    client.send([Hello()])  # a router's first message on a connection
    msgs = client.recv_until(lambda m: isinstance(m, Ready))
    return msgs[-1]  # type: ignore[return-value]


def _finished(rid: int) -> Any:
    return lambda m: isinstance(m, Step) and any(o.rid == rid and o.finish for o in m.outputs)


def test_ready_generate_abort_shutdown(
    worker: tuple[subprocess.Popen, Client], tiny_llama: tuple[Path, Any], tmp_path: Path
) -> None:
    proc, client = worker
    model_dir = tiny_llama[0]
    ready = _ready(client)
    assert (ready.model, ready.vocab_size, ready.kv_capacity) == (model_dir.name, 256, 200)
    assert (ready.max_context, ready.eos_token_ids, ready.page_size) == (200, [2], 4)
    assert (ready.tp_size, ready.device) == (1, "cpu")

    sp = SamplingParams(max_new_tokens=5, ignore_eos=True, logprobs=True)
    client.send([Generate(1, [5, 6, 7], sp), Generate(2, list(range(3, 250)), sp)])
    msgs = client.recv_until(_finished(1))
    outs = [o for m in msgs if isinstance(m, Step) for o in m.outputs if o.rid == 1]
    assert len(outs) == 5 and outs[-1].finish == "length" and outs[0].logprob is not None
    assert all(o.finish is None for o in outs[:-1])
    errors = [m for m in msgs if isinstance(m, Error)]
    assert errors and errors[0].rid == 2 and "200" in errors[0].message
    assert errors[0].code is ErrorCode.CONTEXT_TOO_LONG

    long = SamplingParams(max_new_tokens=150, ignore_eos=True)
    client.send([Generate(3, [5, 6, 7], long)])
    client.recv_until(lambda m: isinstance(m, Step))
    client.send([Abort(3), Abort(12345)])
    load = client.recv_until(lambda m: isinstance(m, Load) and m.running == 0)[-1]
    assert isinstance(load, Load) and (load.kv_used, load.waiting, load.kv_total) == (0, 0, 200)

    client.sock.send(b"\x93not a frame")
    err = client.recv_until(lambda m: isinstance(m, Error))[-1]
    assert isinstance(err, Error) and err.rid is None and err.code is ErrorCode.BAD_MESSAGE

    client.send([Shutdown()])
    assert proc.wait(timeout=TIMEOUT_S) == 0
    log = (tmp_path / "worker.log").read_text()
    assert "[worker 3]" in log and "KV 200 tokens" in log


def test_sigterm_exits_cleanly(worker: tuple[subprocess.Popen, Client]) -> None:
    proc, client = worker
    _ready(client)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT_S) == 0


def test_a_new_connection_gets_ready_and_ends_what_the_last_one_left(
    worker: tuple[subprocess.Popen, Client], tmp_path: Path
) -> None:
    """A router that goes away mid-generation (a crash, a restart) leaves requests nobody
    reads: the worker aborts them (when its next frame finds no router, or at the next
    Hello) and greets the next router with Ready, its pages all free."""
    _, client = worker
    _ready(client)
    long = SamplingParams(max_new_tokens=150, ignore_eos=True)
    client.send([Generate(1, [5, 6, 7], long), Generate(2, [8, 9], long)])
    client.recv_until(lambda m: isinstance(m, Step))
    client.close()
    second = Client(client.address)
    try:
        assert _ready(second).kv_capacity == 200
        load = second.recv_until(lambda m: isinstance(m, Load))[-1]
        assert isinstance(load, Load) and (load.running, load.kv_used) == (0, 0)
        sp = SamplingParams(max_new_tokens=3, ignore_eos=True)
        second.send([Generate(1, [5, 6, 7], sp)])  # the same rid, from the new router
        msgs = second.recv_until(_finished(1))
        assert len([o for m in msgs if isinstance(m, Step) for o in m.outputs]) == 3
    finally:
        second.close()
    assert "aborting 2 requests" in (tmp_path / "worker.log").read_text()


def _frames_until(client: Client, done: Any) -> list[list[Msg]]:
    """Every frame until one holds a message done(msg) is true for (included)."""
    frames: list[list[Msg]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if client.sock.poll(100):
            frames.append(decode_frame(client.sock.recv()))
            if any(done(m) for m in frames[-1]):
                return frames
    raise AssertionError(f"timed out; got {frames[-3:]}")


def test_cache_events_come_before_the_step_and_a_new_connection_gets_them_all(
    worker: tuple[subprocess.Popen, Client],
) -> None:
    """What the router's index is built from: Ready is followed by the whole cache; each
    frame's net changes come before its tokens, so the request's stored prefix is known
    when its last token arrives."""
    _, client = worker
    client.send([Hello()])
    ready, snapshot = _frames_until(client, lambda m: isinstance(m, Ready))[-1]
    assert isinstance(ready, Ready) and snapshot == CacheEvents([], [])
    prompt = list(range(5, 15))
    client.send([Generate(1, prompt, SamplingParams(max_new_tokens=3, ignore_eos=True))])
    frames = _frames_until(client, _finished(1))
    mirror: set[int] = set()
    for frame in frames:
        for m in frame:
            if isinstance(m, CacheEvents):
                assert mirror.isdisjoint(m.stored) and mirror.issuperset(m.removed)
                mirror = (mirror | set(m.stored)) - set(m.removed)
    last = frames[-1]
    assert [type(m) for m in last if not isinstance(m, Load)] == [CacheEvents, Step]
    outputs = [o.token for f in frames for m in f if isinstance(m, Step) for o in m.outputs]
    # The KV of the prompt and of every output but the last is computed: 12 tokens, 3 pages.
    assert mirror == set(chain_hashes(0, (prompt + outputs)[:12], 4))
    client.close()  # (the worker's DEALER would share its frames among both connections)
    second = Client(client.address)
    try:
        second.send([Hello()])
        ready, snapshot = _frames_until(second, lambda m: isinstance(m, Ready))[-1]
        assert isinstance(snapshot, CacheEvents) and set(snapshot.stored) == mirror
    finally:
        second.close()
