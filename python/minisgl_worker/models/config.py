"""`ModelConfig.from_hf`: the one place that knows Hugging Face config.json quirks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..layers.rotary import RopeScaling

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


class ModelConfigError(ValueError):
    """A config.json this worker cannot serve; the message names the field and its value."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_context: int  # max_position_embeddings
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    eos_token_ids: tuple[int, ...] = ()
    # The model's sliding window when it is on and shorter than max_position_embeddings,
    # which then caps max_context (attention here always reads the whole context).
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_ARCHS:
            raise ModelConfigError(f"model_type {self.model_type!r} is not supported (supported: "
                                   f"{', '.join(SUPPORTED_ARCHS)})")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(f"num_attention_heads ({self.num_heads}) must be a multiple "
                                   f"of num_key_value_heads ({self.num_kv_heads})")

    def per_rank(self, tp: int) -> ModelConfig:
        """What one of `tp` ranks computes: its query heads, its KV heads (num_kv_heads / tp,
        or one replicated head when tp exceeds them) and its MLP columns. Hidden size and
        vocabulary stay whole (the LM head gathers every rank's logits). The attention
        backend, the KV pool and the kernel choice are sized by this view."""
        if tp == 1:
            return self
        assert self.num_heads % tp == 0, f"num_heads={self.num_heads} is not divisible by tp={tp}"
        assert self.intermediate_size % tp == 0, (
            f"intermediate_size={self.intermediate_size} is not divisible by tp={tp}")
        assert self.num_kv_heads % tp == 0 or tp % self.num_kv_heads == 0, (
            f"num_kv_heads={self.num_kv_heads} and tp={tp}: one must divide the other")
        return replace(self, num_heads=self.num_heads // tp,
                       num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=self.intermediate_size // tp)

    @classmethod
    def from_hf(cls, path: str | Path) -> ModelConfig:
        """The config of the folder `path`; a ModelConfigError names config.json's field."""
        file = Path(path) / "config.json"
        try:
            raw: dict[str, Any] = json.loads(file.read_text())
            return cls._from_raw(Path(path), raw)
        except ModelConfigError as e:
            raise ModelConfigError(f"{file}: {e}") from None
        except FileNotFoundError:
            raise ModelConfigError(f"{file} does not exist") from None
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{file} is not JSON: {e}") from None
        except KeyError as e:
            raise ModelConfigError(f"{file}: {e.args[0]} is missing") from None

    @classmethod
    def _from_raw(cls, path: Path, raw: dict[str, Any]) -> ModelConfig:
        _refuse_unsupported(raw)
        model_type = raw.get("model_type", "llama")
        heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        theta, scaling = _rope(raw)
        context, window = int(raw.get("max_position_embeddings", 4096)), _sliding_window(raw)
        capping = window if window is not None and window < context else None
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            max_context=capping or context,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always biases q/k/v (and never o); Llama's attention_bias covers all four.
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            rope_scaling=scaling,
            eos_token_ids=_eos_ids(path, raw),
            sliding_window=capping,
        )


def _refuse_unsupported(raw: dict[str, Any]) -> None:
    """Fields whose model this worker would compute wrongly: refused, not ignored."""
    quant = raw.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise ModelConfigError(
            f"quantization_config (quant_method {method!r}) is not supported: serve the "
            "unquantized checkpoint (bfloat16, float16 or float32 weights)")
    if raw.get("mlp_bias", False):
        raise ModelConfigError("mlp_bias true is not supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"hidden_act {act!r} is not supported (supported: silu)")


def _sliding_window(raw: dict[str, Any]) -> int | None:
    """The window when it is on: Qwen2/3 turn theirs on with `use_sliding_window`, Mistral's
    is on when set. Whole-context attention equals the windowed one as long as no sequence
    outgrows the window, so the window caps max_context (as vLLM does where it has no
    windowed kernel)."""
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    return None if window is None else int(window)


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs write
    # `rope_theta` plus an optional `rope_scaling` dict that says `type` or `rope_type`.
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, RopeScaling()
    if rope_type not in ("linear", "llama3", "yarn"):
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported (supported: default, "
                               "linear, llama3, yarn)")
    keys = (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
        "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate",
    )
    found = {k: params[k] for k in keys if params.get(k) is not None}
    if rope_type == "yarn" and "original_max_position_embeddings" not in found:
        found["original_max_position_embeddings"] = raw.get("max_position_embeddings", 4096)
    return theta, RopeScaling(rope_type=rope_type, **found)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _eos_ids(path: Path, raw: dict[str, Any]) -> tuple[int, ...]:
    ids = _as_list(raw.get("eos_token_id"))
    gen = path / "generation_config.json"
    if gen.exists():
        ids += _as_list(json.loads(gen.read_text()).get("eos_token_id"))
    return tuple(dict.fromkeys(ids))  # dedupe, keep order
