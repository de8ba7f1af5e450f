"""FlashInfer's paged attention kernels (CUDA only; flashinfer is imported lazily, never on
the CPU path), behind one class, `FlashInferPagedAttention`.

`plan(attn, ...)` once per batch with host metadata in FlashInfer's CSR form (per request:
its pages, and how many tokens its last page holds; see flashinfer_meta.PagedKVMeta),
then `run(q, k_cache, v_cache)` per layer. Which kernels a batch runs (`core.Attn`) is the
engine's route table's choice (engine/route.py says why each); this class runs it:
DECODE on the decode kernels (tensor cores when the GQA group is >= 2), PREFILL on the
prefill kernels with a causal mask aligned to the end of each request's KV (what a chunk
after a cached prefix needs), MIXED_FA2 on one launch of FA2's prefill kernel (tensor-core
decode is that kernel, so a mixed batch's decode rows cost what they would alone), and
DECODE_THEN_PREFILL on the decode kernel over the leading one-token rows and the prefill
kernel over the rest, each into its slice of one output.

Decode can be captured in CUDA graphs: `init_cuda_graphs` builds one fixed-buffer wrapper per
padded batch size, and `plan_cuda_graph` is called before capture and before every replay.
A graph's split-KV choice is fixed at capture (in graph mode FlashInfer always splits, then
merges), so the sizes in `whole_kv_sizes` get a second variant that reads each request's KV
in one piece: our Triton kernel (triton_decode.py), which starts the longest requests first.

The KV caches may hold FP8 (e4m3, `kv_dtype`) with the query in bf16/fp16: every kernel
here reads it (FlashInfer's FA2 and decode kernels upcast it; FA3 would need an FP8 query,
so prefill runs on FA2), and `run` takes the layer's K and V scales (FlashInfer folds K's
into the softmax scale and multiplies the output by V's).

All wrappers share one float workspace and one device int workspace (`Workspace`, given to
each through FlashInfer's `reset_workspace_buffer`), except the decode half of a
DECODE_THEN_PREFILL batch, whose plan lives beside the prefill half's and so has its own.
That is safe because one batch runs at a time on one stream. A plan fills a wrapper's pinned
host buffer and copies it to the device asynchronously, so each plan first waits for the
previous plan's copy (`Workspace.planning`). With an overlap scheduler that wait is for
batch N-1's kernels at most, while the CPU prepares batch N+1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..core import Attn
from .flashinfer_workspace import Workspace

if TYPE_CHECKING:
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper
    from flashinfer.jit import JitSpec

    from .triton_decode import WholeKVDecode

PrefillBackend = Literal["auto", "fa2", "fa3"]


def resolve_prefill_backend(backend: PrefillBackend, head_dim: int, device: torch.device,
                            fp8_kv: bool = False) -> str:
    """"auto": FA3 (Hopper wgmma kernels) on SM90 for the head dims it instantiates, else FA2;
    always FA2 over an FP8 KV cache (FlashInfer's FA3 reads FP8 KV only with an FP8 query)."""
    assert not (fp8_kv and backend == "fa3"), "FA3 cannot read an FP8 KV cache with a bf16 query"
    if backend != "auto":
        return backend
    sm90 = torch.cuda.get_device_capability(device) == (9, 0)
    return "fa3" if sm90 and head_dim in (64, 128, 256) and not fp8_kv else "fa2"


def tensor_core_decode(num_qo_heads: int, num_kv_heads: int) -> bool:
    """Whether decode runs on tensor cores (FlashInfer's prefill kernels): whenever query
    heads share a KV head, where they win. On the offline workload Qwen3-0.6B (group 2) ran
    6.47 -> 6.23 s with them; Llama (group 4) was measured faster before. MHA keeps the
    CUDA-core kernel."""
    return num_qo_heads // num_kv_heads >= 2


class FlashInferPagedAttention:
    """Paged prefill/decode attention over per-layer k/v caches shaped
    (num_pages, page_size, num_kv_heads, head_dim) (FlashInfer's NHD layout)."""

    def __init__(
        self, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
        dtype: torch.dtype, device: torch.device, *, sm_scale: float | None = None,
        prefill_backend: PrefillBackend = "auto", decode_backend: PrefillBackend = "fa2",
        kv_layout: str = "NHD", kv_dtype: torch.dtype | None = None,
    ) -> None:
        """dtype: the query's and output's; kv_dtype: the caches' (default dtype; or FP8)."""
        import flashinfer

        assert num_qo_heads % num_kv_heads == 0, (num_qo_heads, num_kv_heads)
        self.num_qo_heads, self.num_kv_heads = num_qo_heads, num_kv_heads
        self.head_dim, self.page_size = head_dim, page_size
        self.dtype, self.device = dtype, torch.device(device)
        self.kv_dtype = kv_dtype or dtype
        assert self.kv_dtype in (dtype, torch.float8_e4m3fn), (dtype, self.kv_dtype)
        self.sm_scale = sm_scale if sm_scale is not None else head_dim**-0.5
        self.prefill_backend = resolve_prefill_backend(prefill_backend, head_dim, self.device,
                                                       self.kv_dtype != dtype)
        self.use_tensor_cores = tensor_core_decode(num_qo_heads, num_kv_heads)
        assert decode_backend == "fa2" or self.use_tensor_cores, "fa3 decode needs tensor cores"
        self.decode_backend, self.kv_layout = decode_backend, kv_layout
        self.workspace = ws = Workspace(self.device)
        self._prefill = ws.share(flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            ws.float_ws, kv_layout, backend=self.prefill_backend))
        self._decode = self._new_decode_wrapper()
        self._mixed_decode = self._new_decode_wrapper(own_workspace=True)
        # MIXED_FA2 runs on FA2's prefill kernel, which is what tensor-core decode runs for
        # its decode rows anyway.
        self._mixed_fa2 = None
        if self.use_tensor_cores and decode_backend == "fa2":
            self._mixed_fa2 = self._prefill
            if self.prefill_backend != "fa2":
                self._mixed_fa2 = ws.share(flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    ws.float_ws, kv_layout, backend="fa2"))
        self._graphs: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}  # split-KV
        self._whole_kv: dict[int, WholeKVDecode] = {}
        self._graph_bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._active: Any = None
        self._num_decode_rows = 0  # > 0: DECODE_THEN_PREFILL, `_mixed_decode` runs these rows

    def _new_decode_wrapper(
        self, own_workspace: bool = False, **graph_buffers: Any
    ) -> BatchDecodeWithPagedKVCacheWrapper:
        """A decode wrapper on the shared workspaces, or on its own (`own_workspace`: the
        decode half of a DECODE_THEN_PREFILL batch, planned beside the prefill half)."""
        import flashinfer

        ws = self.workspace
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws.own_float_ws() if own_workspace else ws.float_ws, self.kv_layout,
            use_cuda_graph=bool(graph_buffers), use_tensor_cores=self.use_tensor_cores,
            backend=self.decode_backend, **graph_buffers,
        )
        # Its own workspaces (the int one FlashInfer allocated) when `own_workspace`: its
        # plan must survive the prefill half's, planned next into the shared ones.
        return wrapper if own_workspace else ws.share(wrapper)

    @property
    def supports_mixed_fa2(self) -> bool:
        """Whether Attn.MIXED_FA2 (and the mixed graphs, which run it) is available."""
        return self._mixed_fa2 is not None

    def plan(
        self, attn: Attn, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
    ) -> None:
        """Plan one batch to run `attn` (see `PagedKVMeta`; the indptrs and last-page lengths
        on the host, the page ids preferably on the device). Host-side work; not capturable."""
        with self.workspace.planning():
            self._num_decode_rows = 0
            if attn is Attn.DECODE:
                self._plan_decode(self._decode, kv_indptr, kv_indices, kv_last_page_len)
            elif attn is Attn.PREFILL:
                self._plan_prefill(self._prefill, qo_indptr, kv_indptr, kv_indices,
                                   kv_last_page_len)
            elif attn is Attn.MIXED_FA2:
                assert self._mixed_fa2 is not None, "MIXED_FA2 needs tensor-core decode"
                self._plan_prefill(self._mixed_fa2, qo_indptr, kv_indptr, kv_indices,
                                   kv_last_page_len)
            else:  # decodes first, then prompt chunks: each half on its own kernel
                assert attn is Attn.DECODE_THEN_PREFILL, f"not an eager attention: {attn}"
                d = _leading_single_rows(qo_indptr)
                first_page = int(kv_indptr[d])
                self._plan_decode(self._mixed_decode, kv_indptr[: d + 1],
                                  kv_indices[:first_page], kv_last_page_len[:d])
                self._plan_prefill(self._prefill, qo_indptr[d:] - d, kv_indptr[d:] - first_page,
                                   kv_indices[first_page:], kv_last_page_len[d:])
                self._num_decode_rows = d

    def _plan_prefill(
        self, wrapper: Any, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
    ) -> None:
        wrapper.plan(
            qo_indptr, kv_indptr, kv_indices, kv_last_page_len, self.num_qo_heads,
            self.num_kv_heads, self.head_dim, self.page_size, causal=True,
            sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.kv_dtype,
        )
        self._active = wrapper

    def _plan_decode(
        self, wrapper: BatchDecodeWithPagedKVCacheWrapper, kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, split_kv: bool = True,
    ) -> None:
        wrapper.plan(
            kv_indptr, kv_indices, kv_last_page_len, self.num_qo_heads, self.num_kv_heads,
            self.head_dim, self.page_size, sm_scale=self.sm_scale, q_data_type=self.dtype,
            kv_data_type=self.kv_dtype, disable_split_kv=not split_kv,
        )
        self._active = wrapper

    def activate(self, planned: Any) -> None:
        """Make `run` attend through another planned kernel (mixed_graph.py)."""
        self._active, self._num_decode_rows = planned, 0

    def run(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        out: torch.Tensor | None = None, scales: tuple[float, float] | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), row order as in the plan; k_cache/v_cache one layer's pages, with the
        batch's new tokens already stored -> (T, Hq, D). `scales`: the layer's (K scale,
        V scale) when the caches are FP8 (stored = value / scale), else None. Capturable
        after `plan_cuda_graph` (the scales are constants of the captured launches)."""
        assert self._active is not None, "plan() a batch first"
        assert (scales is not None) == (k_cache.dtype != q.dtype), (k_cache.dtype, scales)
        kw = {} if scales is None else {"k_scale": scales[0], "v_scale": scales[1]}
        if out is None:  # FlashInfer's prefill wrappers would zero it: a fill kernel a layer
            out = torch.empty((q.shape[0], self.num_qo_heads, self.head_dim), dtype=q.dtype,
                              device=q.device)
        d = self._num_decode_rows
        if not d:
            return self._active.run(q, (k_cache, v_cache), out=out, **kw)
        self._mixed_decode.run(q[:d], (k_cache, v_cache), out=out[:d], **kw)
        self._prefill.run(q[d:], (k_cache, v_cache), out=out[d:], **kw)
        return out

    def init_cuda_graphs(
        self, batch_sizes: Sequence[int], max_num_pages: int, whole_kv_sizes: Sequence[int] = ()
    ) -> list[tuple[int, bool]]:
        """One decode wrapper per padded batch size, plus a whole-KV variant (no split; the
        Triton kernel) per size in `whole_kv_sizes` (tensor-core layouts only), all reading
        one set of fixed buffers (`max_num_pages`: the most pages a padded decode batch can
        reference) -> their (batch size, split_kv) pairs, ascending."""
        from .triton_decode import WholeKVDecode

        assert not self._graphs, "CUDA-graph wrappers already built"
        assert set(whole_kv_sizes) <= set(batch_sizes), (whole_kv_sizes, batch_sizes)
        assert self.use_tensor_cores or not whole_kv_sizes, "CUDA-core decode always splits"
        max_bs = max(batch_sizes)
        self._graph_bufs = (
            torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            torch.zeros(max_num_pages, dtype=torch.int32, device=self.device),
            torch.ones(max_bs, dtype=torch.int32, device=self.device),
        )
        indptr, indices, last_page_len = self._graph_bufs
        for bs in batch_sizes:
            self._graphs[bs] = self._new_decode_wrapper(
                paged_kv_indptr_buffer=indptr[: bs + 1],
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last_page_len[:bs],
            )
        for bs in whole_kv_sizes:
            self._whole_kv[bs] = WholeKVDecode(bs, self.num_qo_heads, self.num_kv_heads,
                                               self.head_dim, self.page_size, self.sm_scale,
                                               indices)
        return sorted({(bs, True) for bs in batch_sizes} | {(bs, False) for bs in whole_kv_sizes})

    def graph_page_ids(self, n: int | None = None) -> torch.Tensor:
        """The first n entries (None: all) of the page-id buffer every decode graph reads:
        fill them (stream-ordered) and pass them to `plan_cuda_graph`, which then copies
        nothing."""
        assert self._graph_bufs is not None, "init_cuda_graphs first"
        return self._graph_bufs[1][:n]

    def has_whole_kv_graph(self, batch_size: int) -> bool:
        return batch_size in self._whole_kv

    def plan_cuda_graph(
        self, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
        split_kv: bool = True,
    ) -> None:
        """Plan a decode batch padded to a size given to `init_cuda_graphs` (padding
        requests point at any valid page with length 1). Call before capturing that size and
        before every replay of it; `run` then uses that size's wrapper (the whole-KV kernel
        when not `split_kv`)."""
        bs = kv_last_page_len.numel()
        with self.workspace.planning():
            self._num_decode_rows = 0
            if split_kv:
                self._plan_decode(self._graphs[bs], kv_indptr, kv_indices, kv_last_page_len)
            else:
                assert self._graph_bufs is not None
                buf = self._graph_bufs[1][: kv_indices.numel()]
                if buf.data_ptr() != kv_indices.data_ptr():  # else filled in place already
                    buf.copy_(kv_indices, non_blocking=True)
                self._whole_kv[bs].plan(kv_indptr, kv_last_page_len)
                self._active = self._whole_kv[bs]

    def jit_specs(self) -> list[JitSpec]:
        """The FlashInfer JIT modules this configuration uses (for flashinfer_jit.build_jit)."""
        from flashinfer.jit import gen_batch_decode_module, gen_batch_prefill_module
        from flashinfer.jit.attention import modules

        args = (self.dtype, self.kv_dtype, self.dtype, torch.int32, self.head_dim,
                self.head_dim, 0, False, False)  # no RoPE in the kernel, no window, no soft cap
        # FA2 loads its equal-stride "primary" module (k and v caches share strides here).
        fa2 = getattr(modules, "_gen_batch_prefill_primary_module", gen_batch_prefill_module)
        prefill = {self.prefill_backend} | ({"fa2"} if self.use_tensor_cores else set())
        specs = [(fa2 if b == "fa2" else gen_batch_prefill_module)(b, *args, False)
                 for b in sorted(prefill)]
        if not self.use_tensor_cores:
            specs.append(gen_batch_decode_module(*args))
        return specs


def _leading_single_rows(qo_indptr: torch.Tensor) -> int:
    """How many requests at the front of the batch have a one-token query (qo_indptr on the
    host)."""
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
    return next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
