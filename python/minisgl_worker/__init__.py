"""minisgl's worker: scheduler and engine on PyTorch (and FlashInfer on CUDA).

The router (a Rust extension, `minisgl_worker._router`) ships in the same wheel. Imports
here stay lazy so that `minisgl-router` starts without loading torch.
"""

from typing import Any

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from minisgl_worker.llm import LLM

        return LLM
    if name == "SamplingParams":
        from minisgl_worker.protocol import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'minisgl_worker' has no attribute {name!r}")
