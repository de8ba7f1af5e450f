"""The worker's socket: a ZeroMQ DEALER that binds the --listen address (the router
connects). One frame in may carry many messages; one frame out carries one step's. `Beat`
keeps a worker heard from during a step longer than the router's patience."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from ..protocol import Error, ErrorCode, Msg, ProtocolError, RouterMsg, decode_frame, encode_frame

logger = logging.getLogger(__name__)

# The router takes a remote worker that sent nothing for 4 s for a dead one
# (router/src/worker/client.rs, HEARTBEAT_TIMEOUT), and one step can take longer: a chunk
# of a long prompt on CPU. A step past BEAT_S sends the last Load again every BEAT_S.
BEAT_S = 1.0


class ZmqIO:
    def __init__(self, address: str) -> None:
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)  # let the last frame go out on shutdown
        # No send limit: a frame is never dropped while a router is connected, and a send
        # fails at once (zmq.Again) only when none is.
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.bind(address)
        self.address = address
        self._lock = threading.Lock()  # a socket is used by one thread at a time: see Beat

    def recv(self, timeout_s: float) -> tuple[list[RouterMsg], list[Error]]:
        """Wait up to timeout_s for a frame, then drain what is queued. Returns the messages
        and an Error (rid nil) for every frame that did not decode."""
        with self._lock:
            return self._recv(timeout_s)

    def _recv(self, timeout_s: float) -> tuple[list[RouterMsg], list[Error]]:
        msgs: list[RouterMsg] = []
        errors: list[Error] = []
        if not self.sock.poll(int(timeout_s * 1000)):
            return msgs, errors
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return msgs, errors
            try:
                msgs += decode_frame(data)  # type: ignore[arg-type]
            except (ProtocolError, TypeError, ValueError, KeyError, RecursionError) as e:
                logger.warning("dropping a bad frame: %s", e)
                errors.append(Error(None, ErrorCode.BAD_MESSAGE, f"bad frame: {e}"))

    def send(self, msgs: list[Msg]) -> bool:
        """One frame, never waiting -> False when no router is connected (the frame is
        dropped: its reader is gone, and a worker blocked here could not notice that its
        parent died either)."""
        if not msgs:
            return True
        try:
            with self._lock:
                self.sock.send(encode_frame(msgs), zmq.NOBLOCK)
            return True
        except zmq.Again:
            logger.debug("no router connected; dropped %d messages", len(msgs))
            return False

    def close(self, linger_ms: int = 1000) -> None:
        """Close the socket and remove an ipc:// socket file: the binder owns it, ZeroMQ
        leaves it behind, and a router killed outright cannot remove it."""
        self.sock.close(linger=linger_ms)
        self._ctx.term()
        if self.address.startswith("ipc://"):
            Path(self.address.removeprefix("ipc://")).unlink(missing_ok=True)


class Beat:
    """While the loop is inside `step()`, a helper thread sends `last` (the latest Load the
    loop sent) again every `interval_s`, from `interval_s` into the step on. The loop
    touches the socket only between steps, and ZmqIO's lock orders the rare overlap at a
    step's end."""

    def __init__(self, io: ZmqIO, last: Msg, interval_s: float = BEAT_S) -> None:
        self.io = io
        self.last = last
        self.interval_s = interval_s
        self._since: float | None = None  # when the running step began
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self) -> Iterator[None]:
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            since = self._since
            if since is not None and time.monotonic() - since >= self.interval_s:
                self.io.send([self.last])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
