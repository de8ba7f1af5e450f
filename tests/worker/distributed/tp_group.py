"""Run a function on every rank of a TP group in spawned processes."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, size: int, addr: str, cuda: bool, fn: Callable[..., Any],
           args: tuple[Any, ...]) -> None:
    import torch
    import torch.distributed as dist
    from minisgl_worker.distributed import TPInfo, destroy_distributed, init_distributed

    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    init_distributed(TPInfo(rank, size), addr, device)
    with torch.inference_mode():  # as the engine runs the model
        fn(*args)
    # Leave the group together: a rank exiting with its group alive could abort in the
    # group's threads' teardown ("terminate called without an active exception"), and
    # rank 0 holds the store the others still talk to.
    dist.barrier()
    destroy_distributed()


def run_group(size: int, fn: Callable[..., Any], *args: Any, cuda: bool = False) -> None:
    """fn(*args) on ranks 0..size-1 (gloo on CPU; NCCL with rank r on GPU r when `cuda`),
    each with its TP info and communicator set; an exception on any rank fails the call."""
    addr = f"127.0.0.1:{free_port()}"
    mp.spawn(_entry, args=(size, addr, cuda, fn, args), nprocs=size, join=True)
