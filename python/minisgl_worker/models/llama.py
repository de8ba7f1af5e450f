"""Llama-family decoder (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with qk-norm).
Module names follow HF except the merged `qkv_proj` and `gate_up_proj` (see weights.py).
Every layer is built with its kernels (`Kernels`: fused FlashInfer ops or torch, the GEMM of
the bias-free linears); attention, with qk-norm, RoPE and the KV store, is the attention
backend's (the forward context's)."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import Rope
from ..context import get_global_ctx
from ..distributed import get_tp_info
from ..layers import (
    Kernels,
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    silu_and_mul,
)
from .config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding,
                 kernels: Kernels) -> None:
        super().__init__()
        tp = get_tp_info().size
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_heads // tp
        self.num_kv_heads = max(1, cfg.num_kv_heads // tp)
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias,
            kernels.gemm,
        )
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size,
                                        cfg.o_bias, kernels.gemm)
        # Applied by the backend (in the fused RoPE kernel when kernels.fused), read as weights.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary  # shared by every layer

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # (T, (Hq + 2 Hkv) * D)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # (T, Hq, D)
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        qk_norm = None
        if self.q_norm is not None and self.k_norm is not None:
            qk_norm = (self.q_norm, self.k_norm)
        # qk-norm and RoPE happen in the backend, fused with the KV store on CUDA.
        rope = Rope(self.rotary, positions, qk_norm)
        out = get_global_ctx().attn_backend.forward(q, k, v, self.layer_id, rope)
        return self.o_proj(out.reshape(out.shape[0], -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            cfg.hidden_size, {"gate": inter, "up": inter}, gemm=kernels.gemm
        )
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, gemm=kernels.gemm)
        self.fused = kernels.fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.fused))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding,
                 kernels: Kernels) -> None:
        super().__init__()
        fused = kernels.fused
        self.self_attn = LlamaAttention(cfg, layer_id, rotary, kernels)
        self.mlp = LlamaMLP(cfg, kernels)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward_add(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm.forward_add(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_context, cfg.rope_theta,
                                 cfg.rope_scaling, kernels.fused)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, i, rotary, kernels) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels.fused)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm.forward_add(x, residual)[0]  # (T, H)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.kernels = kernels = kernels or Kernels()
        self.model = LlamaModel(cfg, kernels)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, logits_indices: torch.Tensor,
        logits_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, V) in the model's dtype of the tokens at `logits_indices` only: no LM
        head on the rest; written into `logits_out` when given. (The sampler upcasts only
        when it edits them: a float32 copy of (256, 128k) logits is ~0.2 GB of traffic.)"""
        return self.logits(self.model(input_ids, positions), logits_indices, logits_out)

    def logits(
        self, hidden: torch.Tensor, indices: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The LM head on the rows `indices` of the final hidden states (T, H) -> (B, V)
        (the piecewise graphs run the decoder stack, `self.model`, and then this)."""
        return self.lm_head(hidden[indices], out=out)


def linear_shapes(rank_cfg: ModelConfig) -> dict[tuple[int, int], int]:
    """The (N, K) weight shapes of one rank's bias-free linears (`rank_cfg`: the model's
    `per_rank` view) -> how many layers hold each (what the GEMM choice is timed over before
    the model exists)."""
    cfg = rank_cfg
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, \
        cfg.intermediate_size
    shapes: dict[tuple[int, int], int] = {}
    linears = [(q + 2 * kv, cfg.hidden_size, cfg.qkv_bias), (cfg.hidden_size, q, cfg.o_bias),
               (2 * inter, cfg.hidden_size, False), (cfg.hidden_size, inter, False)]
    for n, k, bias in linears:
        if not bias:
            shapes[n, k] = shapes.get((n, k), 0) + cfg.num_layers
    return shapes
