"""Convert a llama-architecture GGUF into an HF-style folder (the embedded default model).

The output is what `transformers` would load from the hub: float32 `model.safetensors` with HF
Llama names, `config.json`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`
and `chat_template.jinja`. The weights match transformers' own GGUF loader bit for bit
(`gguf.quants.dequantize`, then llama.cpp's rotary row permutation of q/k undone), and the
tokenizer is rebuilt from the `tokenizer.ggml.*` metadata. Used by `default_model.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .startup import progress

# llama.cpp's per-layer tensor names -> HF Llama module names.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All key/value metadata of the file, as Python values."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def hf_tensor_name(name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"unexpected tensor {name!r} in a llama GGUF")


def unpermute_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (its convert script interleaves each head's rotary
    halves): the reshape/swap of transformers' `LlamaTensorProcessor._reverse_permute_weights`.
    For k, `n_head` is the number of KV heads."""
    dim = weight.shape[0] // n_head // 2
    w = weight.reshape(n_head, dim, 2, *weight.shape[1:])
    return np.ascontiguousarray(w.swapaxes(2, 1).reshape(weight.shape))


def convert_tensors(reader: gguf.GGUFReader, n_head: int, n_kv_head: int) -> dict[str, np.ndarray]:
    """Dequantize every tensor to float32 under its HF name (dims already in HF order)."""
    out: dict[str, np.ndarray] = {}
    for t in progress(reader.tensors, desc="minisgl: dequantizing", unit="tensor"):
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        expected = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first
        if w.shape != expected:
            w = w.reshape(expected)
        if ".attn_q." in t.name:
            w = unpermute_rotary(w, n_head)
        elif ".attn_k." in t.name:
            w = unpermute_rotary(w, n_kv_head)
        out[hf_tensor_name(t.name)] = np.ascontiguousarray(w)
    return out


def _f32(value: Any) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def build_config(meta: dict[str, Any], has_lm_head: bool) -> dict[str, Any]:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"only llama GGUFs are supported, this one is {arch!r}")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", get("rope.dimension_count", hidden // n_head)))
    vocab = int(get("vocab_size", len(meta["tokenizer.ggml.tokens"])))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(get("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab,
        "tie_word_embeddings": not has_lm_head,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """Byte-level BPE from `tokenizer.ggml.*`, shaped like SmolLM2's own `tokenizer.json`."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"only byte-level BPE ('gpt2') GGUF vocabularies are supported, "
            f"got {meta.get('tokenizer.ggml.model')!r}"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":  # llama.cpp's "smollm": digits split one by one
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, types, strict=True) if k == _CONTROL]
    user = [t for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError("rebuilt tokenizer's vocabulary size differs from the GGUF's")
    return tok


def _token(meta: dict[str, Any], key: str) -> str | None:
    idx = meta.get(f"tokenizer.ggml.{key}")
    return None if idx is None else meta["tokenizer.ggml.tokens"][idx]


def build_tokenizer_config(meta: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "bos_token": _token(meta, "bos_token_id"),
        "eos_token": _token(meta, "eos_token_id"),
        "pad_token": _token(meta, "padding_token_id"),
        "unk_token": _token(meta, "unknown_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": meta.get("tokenizer.chat_template"),
    }


def build_generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """Stop on the GGUF's eos (`<|im_end|>`, which ends an instruct turn) and `<|endoftext|>`."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    eos = [meta["tokenizer.ggml.eos_token_id"]]
    if "<|endoftext|>" in tokens and tokens.index("<|endoftext|>") not in eos:
        eos.append(tokens.index("<|endoftext|>"))
    return {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Write the HF-style folder for `gguf_path` into the existing directory `out_dir`."""
    out = Path(out_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    meta = read_metadata(reader)
    has_lm_head = any(t.name == "output.weight" for t in reader.tensors)
    config = build_config(meta, has_lm_head)
    tensors = convert_tensors(reader, config["num_attention_heads"], config["num_key_value_heads"])
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    build_tokenizer(meta).save(str(out / "tokenizer.json"))
    tok_config = build_tokenizer_config(meta, config)
    _write_json(out / "tokenizer_config.json", tok_config)
    if tok_config["chat_template"]:
        (out / "chat_template.jinja").write_text(tok_config["chat_template"], encoding="utf-8")
    _write_json(out / "generation_config.json", build_generation_config(meta))
    _write_json(out / "config.json", config)  # last: the folder is only complete with it
