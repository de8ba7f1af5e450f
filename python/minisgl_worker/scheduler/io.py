"""The worker's socket: a ZeroMQ DEALER that binds the --listen address (the router
connects). One frame in may carry many messages; one frame out carries one step's."""

from __future__ import annotations

import logging
from pathlib import Path

import zmq

from ..protocol import Error, ErrorCode, Msg, ProtocolError, RouterMsg, decode_frame, encode_frame

logger = logging.getLogger(__name__)


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

    def recv(self, timeout_s: float) -> tuple[list[RouterMsg], list[Error]]:
        """Wait up to timeout_s for a frame, then drain what is queued. Returns the messages
        and an Error (rid nil) for every frame that did not decode."""
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
            except (ProtocolError, TypeError, ValueError, KeyError) as e:
                logger.warning("dropping a bad frame: %s", e)
                errors.append(Error(None, ErrorCode.BAD_MESSAGE, f"bad frame: {e}"))

    def send(self, msgs: list[Msg]) -> bool:
        """One frame, never waiting -> False when no router is connected (the frame is
        dropped: its reader is gone, and a worker blocked here could not notice that its
        parent died either)."""
        if not msgs:
            return True
        try:
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
