from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.size, f"bad TP rank {self.rank} of {self.size}"

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


_TP_INFO = TPInfo()


def set_tp_info(info: TPInfo) -> None:
    global _TP_INFO
    _TP_INFO = info


def get_tp_info() -> TPInfo:
    return _TP_INFO
