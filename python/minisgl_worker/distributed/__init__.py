"""Tensor-parallel info. Only tp_size == 1 runs today; the layers already slice by it."""

from .info import TPInfo, get_tp_info, set_tp_info

__all__ = ["TPInfo", "get_tp_info", "set_tp_info"]
