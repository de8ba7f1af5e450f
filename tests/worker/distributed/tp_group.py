"""Run a function on every rank of a CPU TP group (gloo) in spawned processes."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, size: int, addr: str, fn: Callable[..., Any], args: tuple[Any, ...]
           ) -> None:
    import torch
    from minisgl_worker.distributed import TPInfo, init_distributed, set_tp_info

    torch.set_num_threads(1)
    info = TPInfo(rank, size)
    set_tp_info(info)
    init_distributed(info, addr, torch.device("cpu"))
    with torch.inference_mode():  # as the engine runs the model
        fn(*args)


def run_group(size: int, fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) on ranks 0..size-1, each with its TP info and communicator set; an
    exception on any rank fails the call."""
    addr = f"127.0.0.1:{free_port()}"
    mp.spawn(_entry, args=(size, addr, fn, args), nprocs=size, join=True)
