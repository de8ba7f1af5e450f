"""A TP group's processes on one host. The process started by the user (or the router) is
the host's first rank; it spawns the host's other ranks and watches them. A rank that
exits takes the group down: the first rank kills the others and exits, which closes rank
0's socket so the router sees the worker fail. A spawned rank exits when the first rank is
gone (killed outright, it could not tell them). Across hosts a lost peer fails the next
collective (gloo and NCCL see the connection close), and each host's ranks go down the
same way."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

POLL_S = 0.2


def free_addr() -> str:
    """127.0.0.1:PORT with a port free now (for a group on this host only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def rank_device(option: str, local_rank: int, tp: int) -> torch.device:
    """The --device option resolved for a rank: with tp > 1 on CUDA, the host's GPU
    `local_rank` (of CUDA_VISIBLE_DEVICES)."""
    if option == "auto":
        option = "cuda" if torch.cuda.is_available() else "cpu"
    if option == "cuda" and tp > 1:
        return torch.device("cuda", local_rank)
    return torch.device(option)


def share_cores(device: torch.device, ranks_here: int) -> None:
    """Make `device` current (CUDA), or give this rank its share of the threads the
    process was given (CPU: the host's ranks share its cores)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // ranks_here))


class LocalRanks:
    """The ranks this process spawned; `start` runs `target(*args, rank)` in each."""

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...], ranks: range) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no CUDA state from the parent
        self.procs = [ctx.Process(target=_child, args=(target, (*args, r), os.getpid()),
                                  name=f"tp-rank-{r}") for r in ranks]
        self._stopping = threading.Event()

    def start(self) -> None:
        for proc in self.procs:
            proc.start()
        threading.Thread(target=self._watch, name="tp-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self._stopping.wait(POLL_S):
            dead = [p for p in self.procs if p.exitcode is not None]
            if dead and not self._stopping.is_set():
                logger.error("TP %s exited (code %s): taking the group down", dead[0].name,
                             dead[0].exitcode)
                self.kill()
                os._exit(1)  # the main thread may be blocked in a collective

    def expect_exits(self) -> None:
        """The group is shutting down (rank 0's loop saw Shutdown, which every rank got):
        a rank that finishes its teardown first and exits is no longer a failure."""
        self._stopping.set()

    def stop(self, grace_s: float) -> None:
        """Wait up to grace_s for the ranks to exit (they got Shutdown), then kill them."""
        self._stopping.set()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join()


def _child(target: Callable[..., Any], args: tuple[Any, ...], parent: int) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    target(*args)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(1)

