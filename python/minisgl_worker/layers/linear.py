"""Column/row-parallel linears. A column-parallel layer holds its rank's rows of the full
weight (a merged one, its rows of each part: [q | k | v], [gate | up]); a row-parallel one
holds `in / tp` columns and all-reduces its output. At tp == 1 there is no communicator and
no collective: the layer is a plain linear.

Weights are loaded through `load(shard, name, full)`, which copies this rank's slice of
`full`: a tensor, or a lazy safetensors slice (so each rank reads only its part of the
file); the model file never sees tensor parallelism. A bias-free layer runs its matmul
through the `gemm` it is built with (kernels.Kernels.gemm: gemm.py's tuned choice of cuBLAS
or CUTLASS on Hopper), else F.linear."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import Communicator, get_comm, get_tp_info
from .kernels import Gemm


def _split(n: int, tp: int, what: str) -> int:
    assert n % tp == 0, f"{what}={n} is not divisible by tp_size={tp}"
    return n // tp


def _comm() -> Communicator | None:
    return get_comm() if get_tp_info().size > 1 else None


class Shard(NamedTuple):
    """One part of a column-parallel weight on this rank."""

    offset: int  # first row in the local weight
    start: int  # first row of this rank's slice in the full part
    rows: int  # rows this rank holds


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 gemm: Gemm | None = None, shards: dict[str | None, Shard] | None = None
                 ) -> None:
        """shards: the parts of a merged layer (by default one part, split evenly)."""
        super().__init__()
        if shards is None:
            tp = get_tp_info()
            n = _split(out_features, tp.size, "out_features")
            shards = {None: Shard(0, tp.rank * n, n)}
        self.shards = shards
        self.out_local = sum(s.rows for s in shards.values())
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features))
        self.bias = nn.Parameter(torch.empty(self.out_local)) if bias else None
        self.gemm = None if bias else gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm is not None:
            return self.gemm(x, self.weight)
        return F.linear(x, self.weight, self.bias)

    def load(self, shard: str | None, name: str, full: Any) -> None:
        assert shard in self.shards, f"unknown shard {shard!r}"
        s = self.shards[shard]
        dst = getattr(self, name).data[s.offset : s.offset + s.rows]
        local = full[s.start : s.start + s.rows]
        assert dst.shape == local.shape, (
            f"shard {shard!r}: rows {s.start}:{s.start + s.rows} of the checkpoint are "
            f"{tuple(local.shape)}, the parameter's {tuple(dst.shape)}")
        dst.copy_(local)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul, e.g. [gate | up], each split evenly."""

    def __init__(self, in_features: int, out_sizes: dict[str, int], bias: bool = False,
                 gemm: Gemm | None = None) -> None:
        tp = get_tp_info()
        shards: dict[str | None, Shard] = {}
        offset = 0
        for name, size in out_sizes.items():
            n = _split(size, tp.size, f"{name} size")
            shards[name] = Shard(offset, tp.rank * n, n)
            offset += n
        super().__init__(in_features, offset, bias, gemm, shards)


class QKVParallelLinear(ColumnParallelLinear):
    """[q | k | v] of this rank's heads: num_heads / tp query heads, and num_kv_heads / tp
    KV heads, or one KV head (that of its query heads) when tp exceeds num_kv_heads."""

    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
        gemm: Gemm | None = None,
    ) -> None:
        tp = get_tp_info()
        assert num_kv_heads % tp.size == 0 or tp.size % num_kv_heads == 0, (
            f"num_kv_heads={num_kv_heads} and tp_size={tp.size}: one must divide the other")
        q = _split(num_heads, tp.size, "num_heads") * head_dim
        kv_heads = max(1, num_kv_heads // tp.size)
        kv, kv_start = kv_heads * head_dim, tp.rank * num_kv_heads // tp.size * head_dim
        shards: dict[str | None, Shard] = {
            "q": Shard(0, tp.rank * q, q), "k": Shard(q, kv_start, kv),
            "v": Shard(q + kv, kv_start, kv),
        }
        super().__init__(hidden, q + 2 * kv, bias, gemm, shards)


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 gemm: Gemm | None = None) -> None:
        super().__init__()
        tp = get_tp_info()
        self.in_local = _split(in_features, tp.size, "in_features")
        self.in_start = tp.rank * self.in_local
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.gemm = None if bias else gemm
        self.comm = _comm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight) if self.gemm is None else self.gemm(x, self.weight)
        if self.comm is not None:
            self.comm.all_reduce(out)  # the partial sums of every rank's columns
        return out if self.bias is None else out + self.bias

    def load(self, shard: str | None, name: str, full: Any) -> None:
        assert shard is None
        param = getattr(self, name)
        # The bias is added once, after the reduction: every rank holds all of it.
        local = full[:] if name == "bias" else full[:, self.in_start : self.in_start + self.in_local]
        assert param.shape == local.shape, (
            f"{name}: the checkpoint's slice is {tuple(local.shape)}, the parameter's "
            f"{tuple(param.shape)}")
        param.data.copy_(local)
