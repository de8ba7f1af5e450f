"""RoPE and the KV store, as an attention backend runs them before it attends: fused into
one kernel per layer when the model's rotary embedding was built fused (CUDA, store.py),
else torch ops (and one Triton launch for the store on CUDA). An FP8 pool is written with
the layer's scales, by the same kernels on CUDA and by torch ops (quant.py) on CPU."""

from __future__ import annotations

import torch

from ..kvcache.pool import MHAKVPool
from ..kvcache.quant import to_cache
from .base import Rope


def store(pool: MHAKVPool, layer: int, loc: torch.Tensor, k: torch.Tensor,
          v: torch.Tensor) -> None:
    """loc (T,) slots; k, v (T, Hkv, D). On CUDA one fused Triton launch (store.py); on CPU
    torch ops (quantized by quant.py when the pool is FP8)."""
    if k.is_cuda:
        from .store import store_kv

        store_kv(pool.k[layer], pool.v[layer], loc, k, v, pool.scales(layer))
    else:
        pool.k_slots(layer)[loc] = to_cache(k, pool.dtype, pool.k_scale[layer])
        pool.v_slots(layer)[loc] = to_cache(v, pool.dtype, pool.v_scale[layer])


def rope_and_store(pool: MHAKVPool, layer: int, loc: torch.Tensor, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, rope: Rope | None,
                   q_out: torch.Tensor | None = None) -> torch.Tensor:
    """Apply `rope` to q and k and write k and v into the pool at `loc` -> the new q,
    written into `q_out` when given (the fused kernel only, which updates q in place
    otherwise)."""
    if rope is None or not rope.rotary.fused:
        assert q_out is None, "q_out needs the fused RoPE kernel (CUDA, bf16/fp16)"
        if rope is not None:
            if rope.qk_norm is not None:
                q, k = rope.qk_norm[0](q), rope.qk_norm[1](k)
            q, k = rope.rotary(rope.positions, q, k)
        store(pool, layer, loc, k, v)
        return q
    from .store import rope_store_kv

    assert rope.rotary.cos_sin is not None, "the fused kernel reads the cos | sin cache"
    norm = None
    if rope.qk_norm is not None:
        q_norm, k_norm = rope.qk_norm
        assert q_norm.eps == k_norm.eps, (q_norm.eps, k_norm.eps)
        norm = (q_norm.weight, k_norm.weight, q_norm.eps)
    rope_store_kv(pool.k[layer], pool.v[layer], loc, rope.positions, rope.rotary.cos_sin, q,
                  k, v, norm, q_out, pool.scales(layer))
    return q if q_out is None else q_out
