"""Model building blocks, torch-native. Parallel layers slice by `distributed.get_tp_info()`."""

from .activation import silu_and_mul
from .embedding import LMHead, VocabParallelEmbedding
from .kernels import Gemm, Kernels
from .linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from .norm import RMSNorm
from .rotary import RopeScaling, RotaryEmbedding

__all__ = [
    "ColumnParallelLinear",
    "Gemm",
    "Kernels",
    "LMHead",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RMSNorm",
    "RopeScaling",
    "RotaryEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "silu_and_mul",
]
