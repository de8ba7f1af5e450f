"""ZmqIO alone: frames in, frames out, bad frames turned into errors (no engine needed)."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import zmq
from minisgl_worker.protocol import (
    VERSION,
    Abort,
    Error,
    ErrorCode,
    Load,
    RouterMsg,
    Shutdown,
    decode_frame,
    encode_frame,
)
from minisgl_worker.scheduler import ZmqIO
from minisgl_worker.scheduler.io import Beat


def test_frames_round_trip_and_bad_frames_become_errors(tmp_path: Path) -> None:
    io = ZmqIO(f"ipc://{tmp_path}/io.sock")
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.connect(io.address)
    try:
        assert io.recv(0.05) == ([], [])  # nothing queued: returns after the timeout
        bad_sampling = {"type": "generate", "rid": 1, "input_ids": [1], "sampling": {"x": 1}}
        peer.send(encode_frame([Abort(1)]))
        peer.send(b"\xc1")  # not msgpack
        peer.send(msgpack.packb({"v": VERSION + 1, "msgs": []}))  # a newer router
        peer.send(msgpack.packb({"v": VERSION - 1, "msgs": [bad_sampling]}))  # an older one
        peer.send(encode_frame([Abort(2), Shutdown()]))
        msgs: list[RouterMsg] = []
        errors: list[Error] = []
        for _ in range(50):
            if len(msgs) + len(errors) == 6:
                break
            got, errs = io.recv(0.1)
            msgs += got
            errors += errs
        assert msgs == [Abort(1), Abort(2), Shutdown()]
        assert len(errors) == 3 and all(isinstance(e, Error) and e.rid is None for e in errors)
        assert all(e.code is ErrorCode.BAD_MESSAGE for e in errors)
        assert io.send([Load(0, 0, 0, 0, 10)])
        assert peer.poll(5000) and decode_frame(peer.recv()) == [Load(0, 0, 0, 0, 10)]
    finally:
        peer.close(linger=0)
        ctx.term()
        io.close(linger_ms=0)


def test_a_send_with_no_router_connected_returns_at_once(tmp_path: Path) -> None:
    io = ZmqIO(f"ipc://{tmp_path}/alone.sock")
    try:
        assert not io.send([Load(0, 0, 0, 0, 10)])  # dropped, not queued, not blocking
        assert io.send([])
    finally:
        io.close(linger_ms=0)


def test_close_removes_the_ipc_socket_file(tmp_path: Path) -> None:
    path = tmp_path / "w.sock"
    io = ZmqIO(f"ipc://{path}")
    assert path.exists()
    io.close(linger_ms=0)
    assert not path.exists()
    ZmqIO("tcp://127.0.0.1:0").close(linger_ms=0)  # nothing to remove


def test_a_step_longer_than_a_beat_sends_the_last_load_on_each_beat(tmp_path: Path) -> None:
    io = ZmqIO(f"ipc://{tmp_path}/beat.sock")
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.connect(io.address)
    beat = Beat(io, Load(0, 0, 0, 0, 10), interval_s=0.05)
    try:
        time.sleep(0.2)  # between steps the loop sends its own Loads: the beat is quiet
        with beat.step():
            pass  # a step shorter than a beat
        time.sleep(0.2)
        assert not peer.poll(0)
        beat.last = Load(1, 0, 0, 0, 10)
        with beat.step():
            time.sleep(0.5)
        frames = []
        while peer.poll(100):
            frames += decode_frame(peer.recv())
        assert len(frames) >= 2 and set(frames) == {Load(1, 0, 0, 0, 10)}, frames
        time.sleep(0.2)
        assert not peer.poll(0)  # the step is over
    finally:
        beat.close()
        peer.close(linger=0)
        ctx.term()
        io.close(linger_ms=0)
