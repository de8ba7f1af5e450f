"""Shared helpers for the GPU attention tests: the real head layouts, random paged batches,
and a float32 reference that gathers each request's K/V from the paged cache by its indices."""

from __future__ import annotations

from typing import NamedTuple

import torch
from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
from minisgl_worker.attention.flashinfer_meta import PagedKVMeta
from minisgl_worker.core import Attn
from minisgl_worker.engine.route import GraphSizes, RouteTable

# name -> (num_qo_heads, num_kv_heads, head_dim)
LAYOUTS = {
    "qwen3-0.6b": (16, 8, 128),
    "llama-3.1-8b": (32, 8, 128),
    "smollm2-135m": (9, 3, 64),
}


def prefill_backends(head_dim: int) -> list[str]:
    """FA3 for every layout (what "auto" picks on an H200); FA2 where its module is compiled
    anyway (head_dim 128: Llama's tensor-core decode runs FA2's prefill kernels)."""
    return ["fa2", "fa3"] if head_dim == 128 else ["fa3"]


class PagedBatch(NamedTuple):
    meta: PagedKVMeta
    new_loc: torch.Tensor  # (T,) int64 slots of the new (query) tokens, in query order
    kv_lens: list[int]


def random_batch(
    q_lens: list[int], prefix_lens: list[int], page_size: int, num_pages: int,
    device: torch.device,
) -> PagedBatch:
    """Requests holding prefix_lens cached tokens and extending by q_lens, on distinct random
    pages of a pool of num_pages."""
    kv_lens = [p + q for p, q in zip(prefix_lens, q_lens)]
    pages_per_req = [-(-n // page_size) for n in kv_lens]
    assert sum(pages_per_req) <= num_pages
    perm = torch.randperm(num_pages)[: sum(pages_per_req)].to(torch.int32)
    indptr = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(pages_per_req).cumsum(0)
    qo_indptr = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.tensor(q_lens).cumsum(0)
    last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per_req)]
    locs = []
    for i, (p, n) in enumerate(zip(prefix_lens, kv_lens)):
        pages = perm[indptr[i] : indptr[i + 1]].long()
        pos = torch.arange(p, n)
        locs.append(pages[pos // page_size] * page_size + pos % page_size)
    meta = PagedKVMeta(
        qo_indptr, indptr, perm.to(device), torch.tensor(last, dtype=torch.int32)
    )
    return PagedBatch(meta, torch.cat(locs).to(device), kv_lens)


def reference_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedKVMeta,
    page_size: int,
) -> torch.Tensor:
    """float32 causal attention; query j of a request of kv_len n and q_len L sees keys
    [0, n - L + j]. q (T, Hq, D) -> (T, Hq, D) float32."""
    num_qo_heads, head_dim = q.shape[1:]
    group = num_qo_heads // k_cache.shape[2]
    indices = meta.kv_indices.long()
    out = []
    for i in range(len(meta.kv_last_page_len)):
        pages = indices[meta.kv_indptr[i] : meta.kv_indptr[i + 1]]
        n = (len(pages) - 1) * page_size + int(meta.kv_last_page_len[i])
        k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n].float()
        v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n].float()
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (n, Hq, D)
        qi = q[meta.qo_indptr[i] : meta.qo_indptr[i + 1]].float()  # (L, Hq, D)
        scores = torch.einsum("qhd,khd->hqk", qi, k) * head_dim**-0.5
        rows = torch.arange(qi.shape[0], device=q.device)[:, None] + (n - qi.shape[0])
        scores.masked_fill_(torch.arange(n, device=q.device)[None, :] > rows, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.cat(out)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN (an unwritten, poisoned element) fails any bound."""
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def eager_attn(attn: FlashInferPagedAttention, q_lens: list[int]) -> Attn:
    """The attention the engine's route table picks for an eager batch of `q_lens`."""
    table = RouteTable(GraphSizes(), flashinfer=True, tensor_core_decode=attn.use_tensor_cores)
    return table.eager_attn(q_lens)


def plan(attn: FlashInferPagedAttention, meta: PagedKVMeta) -> None:
    """Plan `meta` as the engine would an eager batch."""
    q_lens = (meta.qo_indptr[1:] - meta.qo_indptr[:-1]).tolist()
    attn.plan(eager_attn(attn, q_lens), *meta)
