"""Could a Triton paged decode attention read the KV faster than FlashInfer's?

Candidates for the worker's whole-KV decode kernel (python/minisgl_worker/attention/
triton_decode.py is the one chosen from here: one chunk, block 128, 2 stages, 4 warps,
longest request first). Split-KV decode attention over the pool's layout (pages,
page_size, kv heads, head_dim), one program per (request, KV head, KV chunk) holding its
whole GQA group, an online softmax over token blocks gathered through the page ids, then a
merge pass over the chunks (none when one chunk covers every request). It times candidate
settings against FlashInfer at the offline workload's steps, each in a CUDA graph, and checks
the output against torch's. "no softmax" is a diagnostic (the loop's loads and dots only,
wrong output): what the softmax costs.

    python benches/kernels/triton_decode.py [--layout llama-3.1-8b]   # on the GPU
    TRITON_INTERPRET=1 python benches/kernels/triton_decode.py --check   # CPU: against torch
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from minisgl_worker.attention.triton_decode import (
    LOG2E,
    gather_tile,
    load_query_group,
    online_softmax_step,
    softmax_init,
    store_output,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import capture, workload_step

BF16 = torch.bfloat16
QUERY_HEADS = {"qwen3-0.6b": 16, "llama-3.1-8b": 32}  # by layout; both have 8 KV heads of 128


def kv_bytes(kv_lens: list[int]) -> int:
    """The bf16 K and V the requests' 8 KV heads of 128 hold, one layer."""
    return 2 * sum(kv_lens) * 8 * 128 * 2


@triton.jit
def _partial_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, lens_ptr, order_ptr, out_ptr,
                    acc_ptr, ml_ptr, scale_log2, chunk, max_splits,
                    HKV: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr,
                    D: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr,
                    SINGLE: tl.constexpr, SOFTMAX: tl.constexpr):
    # Programs run in `order` (longest request first when the caller sorts it). Without
    # SOFTMAX (a diagnostic, wrong output) the loop keeps its loads and dots only.
    b = tl.load(order_ptr + tl.program_id(0))
    h = tl.program_id(1)
    s = tl.program_id(2)
    kv_len = tl.load(lens_ptr + b)
    start = s * chunk
    end = tl.minimum(start + chunk, kv_len)  # <= start: an empty chunk, nothing stored
    page_base = tl.load(indptr_ptr + b)
    q, heads, rows = load_query_group(q_ptr, b, h, HKV * GROUP * D, D, GROUP, GP, D)
    d = tl.arange(0, D)
    m_i, l_i, acc = softmax_init(GP, D)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < end
        k, v = gather_tile(k_ptr, v_ptr, indices_ptr, page_base, t, valid, h, d, HKV, D, PAGE)
        if SOFTMAX:
            m_i, l_i, acc = online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc)
        else:
            acc += tl.dot((tl.dot(q, tl.trans(k)) * scale_log2).to(v.dtype), v)
            l_i += 1.0
    keep = rows & (start + heads * 0 < kv_len)  # a tensor compare, for the mask's dtype
    if SINGLE:
        store_output(out_ptr, acc, l_i, b, heads, keep, HKV * GROUP, D)
    else:
        at = (b * max_splits + s) * HKV * GROUP + heads  # (batch, split, q head)
        tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=keep[:, None])
        tl.store(ml_ptr + at * 2, m_i, mask=keep)
        tl.store(ml_ptr + at * 2 + 1, l_i, mask=keep)


@triton.jit
def _merge_kernel(acc_ptr, ml_ptr, lens_ptr, out_ptr, chunk, max_splits, HQ: tl.constexpr,
                  D: tl.constexpr, SP: tl.constexpr):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    kv_len = tl.load(lens_ptr + b)
    s = tl.arange(0, SP)
    used = (s < max_splits) & (s * chunk < kv_len)
    at = (b * max_splits + s) * HQ + hq
    m = tl.load(ml_ptr + at * 2, mask=used, other=float("-inf"))
    l_ = tl.load(ml_ptr + at * 2 + 1, mask=used, other=0.0)
    w = tl.math.exp2(m - tl.max(m, 0))
    w = tl.where(used, w, 0.0)
    d = tl.arange(0, D)
    acc = tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=used[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / tl.sum(l_ * w, 0)
    tl.store(out_ptr + (b * HQ + hq) * D + d, o.to(out_ptr.dtype.element_ty))


class TritonDecode:
    """Buffers and launches for one batch shape: `run()` writes `out` (B, Hq, D)."""

    def __init__(self, q, k, v, indptr, indices, lens, chunk: int, block_t: int,
                 stages: int, max_len: int, warps: int = 4, longest_first: bool = False,
                 softmax: bool = True) -> None:
        self.q, self.k, self.v = q, k, v
        self.indptr, self.indices, self.lens = indptr, indices, lens
        self.batch, self.hq, self.d = q.shape
        self.hkv, self.page = k.shape[2], k.shape[1]
        self.chunk = max(block_t, min(chunk, max_len))
        self.splits = -(-max_len // self.chunk)
        self.block_t, self.stages, self.warps = block_t, stages, warps
        self.softmax = softmax
        self.order = (torch.argsort(lens, descending=True) if longest_first else
                      torch.arange(len(lens), device=lens.device)).to(torch.int32)
        self.out = torch.empty_like(q)
        rows = self.batch * self.splits * self.hq
        self.acc = torch.empty(rows, self.d, device=q.device, dtype=torch.float32)
        self.ml = torch.empty(rows, 2, device=q.device, dtype=torch.float32)
        self.scale_log2 = LOG2E / math.sqrt(self.d)

    def run(self) -> torch.Tensor:
        group = self.hq // self.hkv
        single = self.splits == 1
        _partial_kernel[(self.batch, self.hkv, self.splits)](
            self.q, self.k, self.v, self.indptr, self.indices, self.lens, self.order, self.out,
            self.acc, self.ml, self.scale_log2, self.chunk, self.splits, HKV=self.hkv,
            GROUP=group, GP=max(16, triton.next_power_of_2(group)), D=self.d, PAGE=self.page,
            BLOCK_T=self.block_t, SINGLE=single, SOFTMAX=self.softmax, num_warps=self.warps, num_stages=self.stages)
        if not single:
            _merge_kernel[(self.batch, self.hq)](
                self.acc, self.ml, self.lens, self.out, self.chunk, self.splits, HQ=self.hq,
                D=self.d, SP=triton.next_power_of_2(self.splits), num_warps=4)
        return self.out


def paged_batch(kv_lens: list[int], hq: int, hkv: int, d: int, page: int, device,
                dtype: torch.dtype = BF16):
    """Random q and a shuffled page pool holding each request's KV -> (q, k, v, indptr,
    indices, lens) in FlashInfer's CSR page layout (int32)."""
    pages = [-(-n // page) for n in kv_lens]
    total = sum(pages)
    indices = torch.randperm(total, dtype=torch.int32).to(device)
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    k = torch.randn(total, page, hkv, d, dtype=dtype, device=device)
    v = torch.randn_like(k)
    q = torch.randn(len(kv_lens), hq, d, dtype=dtype, device=device)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=device)
    return q, k, v, indptr.to(device), indices, lens


def reference(q, k, v, indptr, indices, lens) -> torch.Tensor:
    """Per request, torch attention over its gathered K and V (float32)."""
    out = torch.empty_like(q, dtype=torch.float32)
    hkv = k.shape[2]
    group = q.shape[1] // hkv
    for b in range(q.shape[0]):
        ids = indices[int(indptr[b]) : int(indptr[b + 1])].long()
        n = int(lens[b])
        kb = k[ids].reshape(-1, hkv, q.shape[2])[:n].float().repeat_interleave(group, 1)
        vb = v[ids].reshape(-1, hkv, q.shape[2])[:n].float().repeat_interleave(group, 1)
        s = torch.einsum("hd,thd->ht", q[b].float(), kb) / math.sqrt(q.shape[2])
        out[b] = torch.einsum("ht,thd->hd", s.softmax(-1), vb)
    return out


def flashinfer_decode_ms(kv_lens: list[int], hq: int, split: bool,
                         tensor_cores: bool = True) -> float:
    """FlashInfer's decode (tensor-core or CUDA-core) over one layer (KV split or not) as a
    CUDA-graph replay, the batch padded to the engine's graph size with one-token rows."""
    import flashinfer
    from minisgl_worker.engine.route import graph_batch_sizes
    from triton.testing import do_bench

    dev = torch.device("cuda")
    padded = next(size for size in graph_batch_sizes(256) if size >= len(kv_lens))
    lens = kv_lens + [1] * (padded - len(kv_lens))
    q, k, v, indptr, indices, _ = paged_batch(lens, hq, 8, 128, 16, dev)
    last = torch.tensor([n - (-(-n // 16) - 1) * 16 for n in lens], dtype=torch.int32,
                        device=dev)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=torch.zeros_like(indptr),
        paged_kv_indices_buffer=torch.zeros_like(indices),
        paged_kv_last_page_len_buffer=torch.ones_like(last))
    wrapper.plan(indptr, indices, last, hq, 8, 128, 16, q_data_type=BF16, kv_data_type=BF16,
                 disable_split_kv=not split)
    out = torch.empty_like(q)
    graph = capture(lambda: wrapper.run(q, (k, v), out=out))
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median")


def check(device: torch.device) -> None:
    """Against torch on small ragged batches, split and unsplit. (The CPU interpreter runs
    float16: it mishandles bf16.)"""
    torch.manual_seed(0)
    dtype = BF16 if device.type == "cuda" else torch.float16
    for kv_lens, chunk in (([1, 17, 100], 32), ([5, 64, 33, 200], 1024), ([300], 64)):
        batch = paged_batch(kv_lens, 4, 2, 128, 16, device, dtype)
        ref = reference(*batch)
        for block_t in (16, 32):
            out = TritonDecode(*batch, chunk=chunk, block_t=block_t, stages=2,
                               max_len=max(kv_lens), longest_first=block_t == 32).run()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            print(f"lens {kv_lens} chunk {chunk} block {block_t}: relative error {err:.1e}")
            assert err < 2e-2, err


def bench(layout: str) -> None:
    from triton.testing import do_bench

    dev = torch.device("cuda")
    print("| step | running | kernel | chunk | block | stages | warps | us | GB/s | error vs torch |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for step in (0, 400, 900):
        kv_lens = workload_step(step)
        hq = QUERY_HEADS[layout]
        batch = paged_batch(kv_lens, hq, 8, 128, 16, dev)
        nbytes = kv_bytes(kv_lens)
        q, k, v, indptr, indices, lens = batch
        some = list(range(0, len(kv_lens), max(1, len(kv_lens) // 8)))  # rows to check
        ref = torch.stack([reference(q[r : r + 1], k, v, indptr[r : r + 2], indices,
                                     lens[r : r + 1])[0] for r in some])
        for variant in ("tc-whole", "tc-split"):
            if variant == "tc-whole" and len(kv_lens) <= 56:
                continue
            ms = flashinfer_decode_ms(kv_lens, hq, split=variant == "tc-split")
            print(f"| {step} | {len(kv_lens)} | FlashInfer {variant} | | | | | "
                  f"{1e3 * ms:.1f} | {nbytes / ms / 1e6:.0f} | |")
        whole = 1 << 20
        variants = [  # chunk, block, stages, warps, longest first, softmax
            (whole, 128, 2, 4, False, True), (whole, 128, 2, 4, True, True),
            (whole, 128, 1, 4, True, True), (whole, 64, 2, 4, True, True),
            (whole, 128, 2, 4, True, False), (whole, 64, 2, 4, True, False),
            (whole, 64, 3, 4, True, False), (256, 128, 2, 4, True, True)]
        for chunk, block_t, stages, warps, lpt, softmax in variants:
            t = TritonDecode(*batch, chunk=chunk, block_t=block_t, stages=stages,
                             max_len=max(kv_lens), warps=warps, longest_first=lpt,
                             softmax=softmax)
            t.run()
            err = ((t.out[some].float() - ref).abs().max() / ref.abs().max()).item()
            ms = do_bench(capture(t.run).replay, warmup=10, rep=50, return_mode="median")
            label = "one chunk" if t.splits == 1 else str(t.chunk)
            kind = ", ".join(["Triton"] + ["longest first"] * lpt + ["no softmax"] * (not softmax))
            print(f"| {step} | {len(kv_lens)} | {kind} | {label} | {block_t} | {stages} | "
                  f"{warps} | {1e3 * ms:.1f} | {nbytes / ms / 1e6:.0f} | "
                  f"{f'{err:.1e}' if softmax else ''} |")


def bench_lengths(layout: str) -> None:
    """Is the kernel's gap to the read floor its ragged lengths? The chosen kernel (one
    chunk, block 128, longest first) at the workload's lengths, at those rounded up or down
    to whole 128-token blocks, and at their mean for every request."""
    from triton.testing import do_bench

    hq = QUERY_HEADS[layout]
    print("| step | running | lengths | mean tokens | us | GB/s |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for step in (0, 400):
        drawn = workload_step(step)
        mean = sum(drawn) // len(drawn)
        for name, kv_lens in (("drawn", drawn), ("up to 128s", [-(-n // 128) * 128 for n in drawn]),
                              ("down to 128s", [max(128, n // 128 * 128) for n in drawn]),
                              ("all the mean", [mean] * len(drawn)),
                              ("all the mean, up to 128s", [-(-mean // 128) * 128] * len(drawn))):
            batch = paged_batch(kv_lens, hq, 8, 128, 16, torch.device("cuda"))
            t = TritonDecode(*batch, chunk=1 << 20, block_t=128, stages=2,
                             max_len=max(kv_lens), longest_first=True)
            ms = do_bench(capture(t.run).replay, warmup=10, rep=50, return_mode="median")
            nbytes = kv_bytes(kv_lens)
            print(f"| {step} | {len(kv_lens)} | {name} | {sum(kv_lens) / len(kv_lens):.0f} | "
                  f"{1e3 * ms:.1f} | {nbytes / ms / 1e6:.0f} |")


def bench_small(layout: str) -> None:
    """The small decode batches of light serving load (the decode graphs below WHOLE_KV_MIN_BS
    run FlashInfer's tensor-core split-KV): the split Triton kernel at several chunk sizes
    against FlashInfer's two decode kernels, one layer, each in a CUDA graph."""
    from triton.testing import do_bench

    hq = QUERY_HEADS[layout]
    print("| running x tokens | kernel | chunk | block | us | GB/s | error vs torch |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for bs, n in ((1, 1024), (4, 1024), (16, 1024), (4, 4096)):
        kv_lens = [n] * bs
        batch = paged_batch(kv_lens, hq, 8, 128, 16, torch.device("cuda"))
        nbytes = kv_bytes(kv_lens)
        ref = reference(*batch)
        for name, tc in (("FlashInfer tc-split", True), ("FlashInfer cuda-core split", False)):
            ms = flashinfer_decode_ms(kv_lens, hq, split=True, tensor_cores=tc)
            print(f"| {bs} x {n} | {name} | | | {1e3 * ms:.1f} | {nbytes / ms / 1e6:.0f} | |")
        for chunk, block_t in ((64, 64), (128, 64), (128, 128), (256, 128), (512, 128)):
            t = TritonDecode(*batch, chunk=chunk, block_t=block_t, stages=2, max_len=n)
            err = ((t.run().float() - ref).abs().max() / ref.abs().max()).item()
            ms = do_bench(capture(t.run).replay, warmup=10, rep=50, return_mode="median")
            print(f"| {bs} x {n} | Triton split + merge | {chunk} | {block_t} | "
                  f"{1e3 * ms:.1f} | {nbytes / ms / 1e6:.0f} | {err:.1e} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="correctness against torch only")
    p.add_argument("--layout", default="qwen3-0.6b", choices=list(QUERY_HEADS))
    p.add_argument("--lengths", action="store_true", help="the ragged-lengths diagnostic")
    p.add_argument("--small", action="store_true", help="small batches (light serving load)")
    args = p.parse_args()
    if args.small:
        bench_small(args.layout)
    elif args.lengths:
        bench_lengths(args.layout)
    elif args.check:
        check(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    else:
        check(torch.device("cuda"))
        bench(args.layout)


if __name__ == "__main__":
    main()
