"""The engine (model + KV pool + attention + sampler on one device) and its config."""

from .config import EngineConfig
from .engine import Engine, ForwardOutput
from .memory import KVMemoryError
from .sampler import SampleOutput, Sampler

__all__ = ["Engine", "EngineConfig", "ForwardOutput", "KVMemoryError", "SampleOutput", "Sampler"]
