from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    page_size: int = 1
    max_running: int = 0  # 0: 256 on CUDA, 32 on CPU
    kv_tokens: int = 0  # 0: auto (see Engine._num_pages)
    load_format: str = "safetensors"  # or "dummy" (random weights)
    attention_backend: str = "auto"  # auto (FlashInfer on CUDA if installed) | torch | flashinfer
    cpu_kv_bytes: int = 1 << 30  # default KV budget on CPU
    gpu_memory_fraction: float = 0.85  # of the free memory after loading, for KV on CUDA

    def __post_init__(self) -> None:
        assert self.page_size >= 1, f"page_size must be >= 1; got {self.page_size}"
        assert self.max_running >= 0 and self.kv_tokens >= 0
        assert self.dtype == "auto" or self.dtype in _DTYPES, f"unknown dtype {self.dtype!r}"

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    def resolve_max_running(self, device: torch.device) -> int:
        if self.max_running:
            return self.max_running
        return 256 if device.type == "cuda" else 32
