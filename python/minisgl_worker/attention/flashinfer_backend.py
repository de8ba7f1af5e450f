"""The FlashInfer attention backend the engine plugs in (CUDA only; flashinfer is imported
lazily, never on the CPU path): `FlashInferBackend` takes the same inputs as
`TorchNativeBackend` plus the query head count, turns each batch's page-table rows into
FlashInfer's paged-KV metadata (`paged_kv_meta`) and runs the kernels of
flashinfer_kernels.py over the pool's per-layer caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from ..core import Batch, get_global_ctx
from ..kvcache import MHAKVPool
from ..transfer import to_device
from .base import BaseAttnBackend, Rope, rope_and_store
from .flashinfer_kernels import FlashInferPagedAttention, PrefillBackend

if TYPE_CHECKING:
    from ..engine.piecewise import PiecewiseGraphs


class PagedKVMeta(NamedTuple):
    """One batch's attention metadata in FlashInfer's layout (int32)."""

    qo_indptr: torch.Tensor  # (B+1,) host, query rows of request i: [qo_indptr[i], [i+1])
    kv_indptr: torch.Tensor  # (B+1,) host, pages of request i: kv_indices[kv_indptr[i]:...]
    kv_indices: torch.Tensor  # (P,) device, page ids
    kv_last_page_len: torch.Tensor  # (B,) host, tokens in each request's last page, >= 1


def paged_kv_meta(
    page_table: torch.Tensor, rows: Sequence[int], kv_lens: Sequence[int],
    q_lens: Sequence[int], page_size: int,
) -> PagedKVMeta:
    """Metadata for requests at page-table `rows` holding `kv_lens` tokens (their new ones
    included) and extending by `q_lens`. The page table holds a slot (page * page_size +
    offset) per position, so a page's id is the slot of its first position // page_size.

    The page ids are gathered on the table's device from per-request sizes (a few hundred
    numbers cross to it, not one index per page): at page size 1 a batch of 256 x 1024
    tokens has 262k pages, and building their index lists on the host cost ~5 ms a step."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    pages, indptr, last = page_counts(lens, page_size)
    total, device = int(indptr[-1]), page_table.device
    sizes = to_device(np.stack([np.asarray(rows, dtype=np.int64), pages, indptr[:-1]]), device)
    row_t, pages_t, start_t = sizes  # (B,) each
    row_idx = torch.repeat_interleave(row_t, pages_t, output_size=total)  # no sync: sized
    first = torch.repeat_interleave(start_t, pages_t, output_size=total)
    col_idx = (torch.arange(total, device=device) - first) * page_size
    kv_indices = page_table[row_idx, col_idx]
    if page_size > 1:
        kv_indices = kv_indices // page_size
    return PagedKVMeta(
        qo_indptr=_indptr(q_lens),
        kv_indptr=torch.from_numpy(indptr.astype(np.int32)),
        kv_indices=kv_indices.to(torch.int32),
        kv_last_page_len=torch.from_numpy(last.astype(np.int32)),
    )


def page_counts(
    lens: np.ndarray, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests of `lens` tokens (int64) -> (pages each, their CSR indptr (B+1,), tokens in
    each last page (>= 1))."""
    pages = (lens + page_size - 1) // page_size
    indptr = np.zeros(len(pages) + 1, dtype=np.int64)
    np.cumsum(pages, out=indptr[1:])
    return pages, indptr, lens - (pages - 1) * page_size


def gather_pages(page_table: torch.Tensor, rows: Sequence[int], lens: Sequence[int],
                 page_size: int, dummy_page: int, out: torch.Tensor,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The page ids of requests at page-table `rows` (< 0: a padding request, whose pages are
    all `dummy_page`) holding `lens` tokens, written into `out` in CSR order on the table's
    device in one launch (page_ids.py) -> (their indptr (B+1,), tokens in each last page
    (B,)), int32 host arrays."""
    from .page_ids import gather_page_ids  # imports triton: CUDA only

    pages, indptr, last = page_counts(np.asarray(lens, dtype=np.int64), page_size)
    sizes = to_device(np.stack([np.asarray(rows, dtype=np.int64), pages, indptr[:-1]]),
                      page_table.device)
    gather_page_ids(page_table, sizes, page_size, dummy_page, out)
    return indptr.astype(np.int32), last.astype(np.int32)


def _indptr(lens: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0, out=out[1:])
    return out


class FlashInferBackend(BaseAttnBackend):
    """The engine's plug: `prepare_metadata` plans, `forward` stores k/v then attends."""

    def __init__(
        self, kv_pool: MHAKVPool, page_table: torch.Tensor, scale: float, num_qo_heads: int,
        prefill_backend: PrefillBackend = "auto",
    ) -> None:
        num_kv_heads, head_dim = kv_pool.k.shape[3:]
        self.kv_pool = kv_pool
        self.page_table = page_table
        self.attn = FlashInferPagedAttention(
            num_qo_heads, num_kv_heads, head_dim, kv_pool.page_size, kv_pool.k.dtype,
            kv_pool.k.device, sm_scale=scale, prefill_backend=prefill_backend,
        )
        self.cut: PiecewiseGraphs | None = None  # set while piecewise graphs are captured

    def prepare_metadata(self, batch: Batch) -> None:
        meta = paged_kv_meta(
            self.page_table, [r.table_idx for r in batch.reqs],
            [r.device_len for r in batch.reqs], batch.extend_lens, self.kv_pool.page_size,
        )
        self.attn.plan(*meta)
        batch.attn_metadata = meta

    def split_kv_for(self, batch: Batch, padded_bs: int) -> bool:
        """Whether a decode batch padded to `padded_bs` needs the split-KV graph. Without a
        split each (request, KV head) is one CTA, so the longest request sets the kernel's
        time: the whole-KV graph is taken when one exists for the size (enough CTAs to fill
        the GPU) and no request is longer than twice the mean."""
        if not batch.reqs or not self.attn.has_whole_kv_graph(padded_bs):
            return True
        lens = [r.device_len for r in batch.reqs]
        return max(lens) * len(lens) > 2 * sum(lens)

    def plan_padded(self, batch: Batch, padded_bs: int, split_kv: bool = True) -> None:
        """Plan a decode batch for the CUDA graph of size padded_bs >= batch.size (the
        whole-KV variant when not `split_kv`): each padding row attends over one token of
        the pool's dummy page. The page ids go straight into the graphs' buffer in one
        launch (page_ids.py); the indptr and last-page lengths stay on the host."""
        pad = padded_bs - batch.size
        indptr, last = gather_pages(
            self.page_table, [r.table_idx for r in batch.reqs] + [-1] * pad,
            [r.device_len for r in batch.reqs] + [1] * pad, self.kv_pool.page_size,
            self.kv_pool.dummy_page, self.attn.graph_page_ids())
        self.attn.plan_cuda_graph(torch.from_numpy(indptr),
                                  self.attn.graph_page_ids(int(indptr[-1])),
                                  torch.from_numpy(last), split_kv)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        batch, cut = get_global_ctx().batch, self.cut
        if cut is not None:  # capturing piecewise graphs: attention runs between the pieces
            rope_and_store(self.kv_pool, layer_id, batch.out_loc, q, k, v, rope,
                           cut.q_out(q.shape[0]))
            return cut.cut(layer_id, q.shape[0])
        q = rope_and_store(self.kv_pool, layer_id, batch.out_loc, q, k, v, rope)
        # q may be a strided view of the fused qkv output (in-place RoPE): FlashInfer's
        # kernels take its row and head strides, so it is not copied.
        return self.attn.run(q, self.kv_pool.k[layer_id], self.kv_pool.v[layer_id])
