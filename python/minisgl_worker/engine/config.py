from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    page_size: int = 0  # tokens per KV page; 0: 16
    max_running: int = 0  # 0: 256 on CUDA, 32 on CPU
    kv_tokens: int = 0  # 0: auto (see Engine._num_pages)
    load_format: str = "safetensors"  # or "dummy" (random weights)
    attention_backend: str = "auto"  # auto (FlashInfer on CUDA if installed) | torch | flashinfer
    cpu_kv_bytes: int = 1 << 30  # default KV budget on CPU
    # CUDA: the share of the GPU's total memory this engine may hold (weights, activations
    # of the largest prefill chunk, CUDA graphs, KV); KV gets what the rest leaves.
    gpu_memory_fraction: float = 0.9
    chunk_size: int = 8192  # the scheduler's prefill token budget: sizes the profiled forward
    cuda_graph_max_bs: int = -1  # -1: 256 on GPUs with >= 80 GiB, else 128; 0: no graphs
    # Batches with prompt tokens (prefill, mixed) of up to this many tokens, or of exactly
    # chunk_size, replay piecewise CUDA graphs (engine/graphs/piecewise.py; FlashInfer with
    # bf16/fp16); -1: 512; 0: none.
    cuda_graph_max_tokens: int = -1
    # Mixed steps (decodes and prompt chunks, enough requests: engine/route.py) of up to
    # this many tokens replay whole CUDA graphs, attention included (engine/graphs/mixed.py; needs
    # the piecewise graphs, capped at cuda_graph_max_tokens); 0: none (they take steps
    # through the piecewise graphs instead).
    cuda_graph_mixed_tokens: int = 256
    # The GEMM of the bias-free linears: auto (on Hopper in bf16, cuBLAS or CUTLASS with PDL
    # by size, layers/gemm.py) | cublas (everywhere).
    gemm: str = "auto"
    # KV cache storage: auto (the model's dtype) | fp8_e4m3 (a scale per layer for K and for
    # V, kvcache/quant.py; half the bytes of bf16), on every attention backend.
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        assert self.page_size >= 0, f"page_size must be >= 0; got {self.page_size}"
        assert self.max_running >= 0 and self.kv_tokens >= 0
        assert self.dtype == "auto" or self.dtype in _DTYPES, f"unknown dtype {self.dtype!r}"
        assert 0 < self.gpu_memory_fraction <= 1 and self.chunk_size >= 1
        assert self.cuda_graph_max_bs >= -1
        assert self.cuda_graph_max_tokens in (-1, 0) or self.cuda_graph_max_tokens >= 16, (
            f"cuda_graph_max_tokens must be -1, 0 or >= 16; got {self.cuda_graph_max_tokens}")
        assert self.gemm in ("auto", "cublas"), f"gemm must be auto or cublas; got {self.gemm!r}"
        assert self.kv_cache_dtype in ("auto", "fp8_e4m3"), (
            f"kv_cache_dtype must be auto or fp8_e4m3; got {self.kv_cache_dtype!r}")
        assert self.cuda_graph_mixed_tokens == 0 or self.cuda_graph_mixed_tokens >= 16, (
            f"cuda_graph_mixed_tokens must be 0 or >= 16; got {self.cuda_graph_mixed_tokens}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    def resolve_kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8_e4m3" else model_dtype

    def resolve_page_size(self) -> int:
        """16 (vLLM's default block size). On CUDA FlashInfer reads whole pages, measured
        ~1-2% faster than page 1 on mini-sglang's offline workload (benches/RESULTS.md). On
        CPU too: the prefix cache reports its changes to the router one block hash per page
        (kvcache/blocks.py), and a hash per token would cost more than the tokens. The
        prefix cache then matches in steps of 16 tokens."""
        return self.page_size or 16

    def resolve_max_running(self, device: torch.device) -> int:
        if self.max_running:
            return self.max_running
        return 256 if device.type == "cuda" else 32

    def resolve_graph_max_bs(self, gpu_memory: int, max_running: int) -> int:
        """On a GPU of `gpu_memory` bytes: the largest decode graph's batch."""
        bs = self.cuda_graph_max_bs
        if bs < 0:
            bs = 256 if gpu_memory >= 80 << 30 else 128
        return min(bs, max_running)

    def resolve_graph_max_tokens(self) -> int:
        """On a GPU: the largest piecewise bucket below the chunk size (0: none)."""
        return 512 if self.cuda_graph_max_tokens < 0 else self.cuda_graph_max_tokens

    def resolve_graph_mixed_tokens(self, graph_max_tokens: int) -> int:
        """The mixed graphs' largest size, given the piecewise graphs' (0: none)."""
        return min(self.cuda_graph_mixed_tokens, graph_max_tokens)
