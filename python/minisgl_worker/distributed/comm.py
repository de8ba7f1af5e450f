"""The TP group's collectives, on torch.distributed.

Two process groups over the same ranks:
- the device group runs the model's collectives on its tensors: NCCL on CUDA (torch's
  NCCL collectives run on the current stream's order and are captured by CUDA graphs; they
  never sync the host), gloo on CPU;
- the host group (gloo on every device) carries the worker loop's Python objects: rank 0's
  messages of each step and the KV capacity agreed at start.

At tp == 1 no communicator exists: the layers skip their collectives altogether."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .info import TPInfo, set_tp_info

logger = logging.getLogger(__name__)

# Rank 0 waits at most a second for the router between broadcasts, but start-up (loading
# an 8B checkpoint, compiling kernels, capturing graphs) may hold one rank much longer.
TIMEOUT = timedelta(minutes=30)


class Communicator:
    def __init__(self, info: TPInfo, device_group: Any, host_group: Any) -> None:
        self.info = info
        self.device_group = device_group
        self.host_group = host_group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place -> x."""
        dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(n, ...) on each rank -> (tp * n, ...): rank 0's rows, then rank 1's, ..."""
        out = x.new_empty((self.info.size * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=self.device_group)
        return out

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x on every rank, in place -> x."""
        dist.broadcast(x, src=0, group=self.device_group)
        return x

    def broadcast_objects(self, objs: list[Any] | None) -> list[Any]:
        """Rank 0's list (picklable objects) on every rank; the others pass None."""
        box = [objs if self.info.is_primary else None]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        assert box[0] is not None
        return box[0]

    def min_int(self, value: int) -> int:
        """The smallest `value` over the ranks."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.host_group)
        return int(t.item())


_COMM: Communicator | None = None


def init_distributed(info: TPInfo, init_addr: str, device: torch.device) -> Communicator:
    """Join the TP group at `init_addr` (HOST:PORT, where rank 0 listens): set this process's
    TP info and communicator (what the parallel layers are built with). On CUDA the caller
    has made `device` current."""
    global _COMM
    assert _COMM is None, "the TP group is initialized once per process"
    assert info.size > 1, "tp_size 1 needs no communicator"
    set_tp_info(info)
    cuda = device.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://{init_addr}", rank=info.rank,
        world_size=info.size, timeout=TIMEOUT, device_id=device if cuda else None,
    )
    host = dist.new_group(backend="gloo", timeout=TIMEOUT) if cuda else dist.group.WORLD
    _COMM = Communicator(info, dist.group.WORLD, host)
    logger.info("TP rank %d of %d joined %s (%s)", info.rank, info.size, init_addr,
                "nccl" if cuda else "gloo")
    return _COMM


def get_comm() -> Communicator:
    assert _COMM is not None, "tp_size > 1 needs init_distributed first"
    return _COMM


def destroy_distributed() -> None:
    """Leave the TP group; this process is a tp == 1 process again."""
    global _COMM
    if _COMM is not None:
        _COMM = None
        dist.destroy_process_group()
        set_tp_info(TPInfo())
