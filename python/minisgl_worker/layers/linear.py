"""Column/row-parallel linears. A column-parallel layer holds `out / tp` rows of the full
weight, a row-parallel one `in / tp` columns and all-reduces its output (a no-op at tp=1).
Weights are loaded through `load(name_shard, tensor)` which does the TP slicing, so the
model file never sees tensor parallelism. A bias-free layer runs its matmul through the
`gemm` it is built with (kernels.Kernels.gemm: gemm.py's tuned choice of cuBLAS or CUTLASS on
Hopper), else F.linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import get_tp_info
from .kernels import Gemm


def _split(n: int, tp: int, what: str) -> int:
    assert n % tp == 0, f"{what}={n} is not divisible by tp_size={tp}"
    return n // tp


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 gemm: Gemm | None = None) -> None:
        super().__init__()
        tp = get_tp_info()
        self.out_local = _split(out_features, tp.size, "out_features")
        self.weight = nn.Parameter(torch.empty(self.out_local, in_features))
        self.bias = nn.Parameter(torch.empty(self.out_local)) if bias else None
        self.gemm = None if bias else gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm is not None:
            return self.gemm(x, self.weight)
        return F.linear(x, self.weight, self.bias)

    def _copy_rows(self, param: nn.Parameter, start: int, full: torch.Tensor) -> None:
        """Copy this rank's slice of `full` (dim 0) into param rows [start, start + n)."""
        tp = get_tp_info()
        n = full.shape[0] // tp.size
        local = full[tp.rank * n : (tp.rank + 1) * n]
        assert param.data[start : start + n].shape == local.shape, (
            f"shape mismatch: param rows {start}:{start + n} of {tuple(param.shape)} "
            f"vs {tuple(local.shape)}"
        )
        param.data[start : start + n].copy_(local)

    def load(self, shard: str | None, name: str, tensor: torch.Tensor) -> None:
        assert shard is None
        self._copy_rows(getattr(self, name), 0, tensor)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul, e.g. [gate | up]."""

    def __init__(self, in_features: int, out_sizes: dict[str, int], bias: bool = False,
                 gemm: Gemm | None = None) -> None:
        super().__init__(in_features, sum(out_sizes.values()), bias, gemm)
        tp = get_tp_info().size
        self.offsets: dict[str, int] = {}
        offset = 0
        for shard, size in out_sizes.items():
            self.offsets[shard] = offset
            offset += _split(size, tp, f"{shard} size")

    def load(self, shard: str | None, name: str, tensor: torch.Tensor) -> None:
        assert shard in self.offsets, f"unknown shard {shard!r}"
        self._copy_rows(getattr(self, name), self.offsets[shard], tensor)


class QKVParallelLinear(MergedColumnParallelLinear):
    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
        gemm: Gemm | None = None,
    ) -> None:
        sizes = {"q": num_heads * head_dim, "k": num_kv_heads * head_dim}
        sizes["v"] = sizes["k"]
        super().__init__(hidden, sizes, bias, gemm)


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 gemm: Gemm | None = None) -> None:
        super().__init__()
        tp = get_tp_info()
        self.in_local = _split(in_features, tp.size, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.gemm = None if bias else gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight) if self.gemm is None else self.gemm(x, self.weight)
        # tp > 1: all-reduce `out` here (distributed/communicator, a later issue).
        assert get_tp_info().size == 1, "tensor parallelism is not wired yet"
        return out if self.bias is None else out + self.bias

    def load(self, shard: str | None, name: str, tensor: torch.Tensor) -> None:
        assert shard is None
        param = getattr(self, name)
        if name == "bias":  # the bias is added once, after the reduction
            param.data.copy_(tensor)
            return
        tp = get_tp_info()
        n = self.in_local
        param.data.copy_(tensor[:, tp.rank * n : (tp.rank + 1) * n])
