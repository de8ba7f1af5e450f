"""Tensor parallelism: this process's place in its TP group (`TPInfo`) and the group's
collectives (`Communicator`, on torch.distributed: NCCL or gloo)."""

from .comm import Communicator, destroy_distributed, get_comm, init_distributed
from .info import TPInfo, get_tp_info, set_tp_info

__all__ = [
    "Communicator",
    "TPInfo",
    "destroy_distributed",
    "get_comm",
    "get_tp_info",
    "init_distributed",
    "set_tp_info",
]
