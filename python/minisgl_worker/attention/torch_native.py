"""Torch-native paged attention for CPU and GPU. For each request: gather its k/v slots via
its page-table row, then `scaled_dot_product_attention`. Query i of an extend sits at
position `cached_len + i`, so it sees keys [0, cached_len + i]: a causal mask shifted by the
prefix (what makes chunked prefill correct). Decodes (one query) need no mask and are
batched together, padded to the longest and masked by length. An FP8 pool is read back in
the model's dtype (kvcache/quant.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..context import get_global_ctx
from ..core import Attn, Batch, Route
from ..kvcache import MHAKVPool
from ..kvcache.quant import from_cache
from .base import BaseAttnBackend, Rope
from .rope_store import rope_and_store


@dataclass
class _Extend:
    q_start: int
    q_end: int
    slots: torch.Tensor  # (L,) KV slots of the request's tokens [0, device_len)
    mask: torch.Tensor | None  # (n, L) bool, True = may attend; None when causal-aligned


@dataclass
class _Decodes:
    q_index: torch.Tensor  # (B,) row of each decode's query in the flat token dim
    slots: torch.Tensor  # (B, Lmax) KV slots, padded with slot 0
    mask: torch.Tensor  # (B, 1, 1, Lmax) bool, False on the padding


@dataclass
class TorchNativeMetadata:
    extends: list[_Extend]
    decodes: _Decodes | None


class TorchNativeBackend(BaseAttnBackend):
    def __init__(self, kv_pool: MHAKVPool, page_table: torch.Tensor, scale: float) -> None:
        self.kv_pool = kv_pool
        self.page_table = page_table  # (max_running, max_context) int, slot per position
        self.scale = scale
        self._meta: TorchNativeMetadata | None = None

    def prepare(self, batch: Batch, route: Route) -> None:
        assert route.attn is Attn.TORCH, f"torch-native attention cannot run {route}"
        device = self.page_table.device
        extends: list[_Extend] = []
        dec_index: list[int] = []
        dec_lens: list[int] = []
        dec_rows: list[int] = []
        start = 0
        for row, length, n in zip(batch.table_rows, batch.kv_lens, batch.extend_lens):
            if n == 1:
                dec_index.append(start)
                dec_lens.append(length)
                dec_rows.append(row)
            else:
                slots = self.page_table[row, :length].long()
                pos = torch.arange(length - n, length, device=device)
                mask = torch.arange(length, device=device)[None, :] <= pos[:, None]
                extends.append(_Extend(start, start + n, slots, None if n == length else mask))
            start += n
        self._meta = TorchNativeMetadata(extends, self._decodes(dec_index, dec_lens, dec_rows))

    def _decodes(self, index: list[int], lens: list[int], rows: list[int]) -> _Decodes | None:
        if not index:
            return None
        device = self.page_table.device
        lmax = max(lens)
        lens_t = torch.tensor(lens, device=device)
        valid = torch.arange(lmax, device=device)[None, :] < lens_t[:, None]  # (B, Lmax)
        slots = self.page_table[torch.tensor(rows, device=device), :lmax].long()
        slots = torch.where(valid, slots, 0)
        q_index = torch.tensor(index, device=device)
        return _Decodes(q_index, slots, valid[:, None, None, :])

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        batch = get_global_ctx().batch
        meta = self._meta
        assert meta is not None, "prepare() a batch first"
        q = rope_and_store(self.kv_pool, layer_id, batch.out_loc, q, k, v, rope)
        pool = self.kv_pool
        k_all, v_all = pool.k_slots(layer_id), pool.v_slots(layer_id)
        k_scale, v_scale = pool.k_scale[layer_id], pool.v_scale[layer_id]

        out = torch.empty_like(q)
        for e in meta.extends:
            qq = q[e.q_start : e.q_end].transpose(0, 1)  # (Hq, n, D)
            kk = from_cache(k_all[e.slots], q.dtype, k_scale).transpose(0, 1)  # (Hkv, L, D)
            vv = from_cache(v_all[e.slots], q.dtype, v_scale).transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=e.mask, is_causal=e.mask is None, scale=self.scale,
                enable_gqa=True,
            )
            out[e.q_start : e.q_end] = o.transpose(0, 1)
        if meta.decodes is not None:
            d = meta.decodes
            qq = q[d.q_index].unsqueeze(2)  # (B, Hq, 1, D)
            kk = from_cache(k_all[d.slots], q.dtype, k_scale).transpose(1, 2)  # (B, Hkv, L, D)
            vv = from_cache(v_all[d.slots], q.dtype, v_scale).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=d.mask, scale=self.scale, enable_gqa=True
            )
            out[d.q_index] = o.squeeze(2)
        return out
