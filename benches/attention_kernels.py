"""Micro-benchmark of the FlashInfer attention kernels behind `FlashInferPagedAttention`.

- decode: achieved KV bandwidth (bytes of K and V read once / median kernel time) at batch
  64 and 256 x 1024 tokens, per page size, for the Qwen3-0.6B head layout (16 q / 8 kv heads,
  head_dim 128; CUDA cores) and Llama-3.1-8B (32 / 8; tensor cores). The floor is the HBM
  copy bandwidth (~4.3 TB/s measured on the H200).
- prefill: TFLOP/s (4 * Hq * D per causal (query, key) pair) of FA2 vs FA3, fresh prompts
  and chunks after a cached prefix, to choose `prefill_backend`.
- plan: host time of one decode plan at batch 256 (the CPU cost per scheduler step).

Times are CUDA-event medians (triton's do_bench). Usage: python benches/attention_kernels.py
(writes $OUT/bench.json when OUT is set; prints a table last)."""

from __future__ import annotations

import itertools
import json
import os
import time

import torch
from minisgl_worker.attention.flashinfer_backend import PagedKVMeta
from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
from triton.testing import do_bench
from workload import draw

DEV = torch.device("cuda")
BF16 = torch.bfloat16
LAYOUTS = {"qwen3-0.6b": (16, 8, 128), "llama-3.1-8b": (32, 8, 128)}


def _meta(q_lens: list[int], kv_lens: list[int], page_size: int) -> PagedKVMeta:
    """Requests on contiguous runs of a shuffled page pool (what a warm allocator gives)."""
    pages = [-(-n // page_size) for n in kv_lens]
    perm = torch.randperm(sum(pages), dtype=torch.int32)
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    qo = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)],
                        dtype=torch.int32)
    return PagedKVMeta(qo, indptr, perm.to(DEV), last)


def _setup(layout: str, page_size: int, q_lens: list[int], kv_lens: list[int],
           backend: str = "auto", decode_backend: str = "fa2", kv_layout: str = "NHD",
           ) -> tuple[FlashInferPagedAttention, torch.Tensor, torch.Tensor, torch.Tensor]:
    hq, hkv, d = LAYOUTS[layout]
    meta = _meta(q_lens, kv_lens, page_size)
    num_pages = int(meta.kv_indptr[-1])
    shape = (num_pages, page_size, hkv, d) if kv_layout == "NHD" else (num_pages, hkv, page_size, d)
    k = torch.randn(shape, device=DEV, dtype=BF16)
    v = torch.randn_like(k)
    attn = FlashInferPagedAttention(hq, hkv, d, page_size, BF16, DEV,
                                    prefill_backend=backend,  # type: ignore[arg-type]
                                    decode_backend=decode_backend,  # type: ignore[arg-type]
                                    kv_layout=kv_layout)
    attn.plan(*meta)
    q = torch.randn(sum(q_lens), hq, d, device=DEV, dtype=BF16)
    return attn, q, k, v


def bench_decode(layout: str, batch: int, kv_len: int, page_size: int) -> dict[str, object]:
    attn, q, k, v = _setup(layout, page_size, [1] * batch, [kv_len] * batch)
    ms = do_bench(lambda: attn.run(q, k, v), warmup=25, rep=200, return_mode="median")
    nbytes = 2 * batch * kv_len * k.shape[2] * k.shape[3] * k.element_size()
    return {"kind": "decode", "layout": layout, "batch": batch, "kv_len": kv_len,
            "page_size": page_size, "ms": ms, "GB/s": nbytes / ms / 1e6}


def bench_ragged_decode(layout: str, batch: int, page_size: int, backend: str,
                        kv_layout: str) -> dict[str, object]:
    """Decode at the offline workload's lengths: KV lengths uniform in [100, 2048]."""
    gen = torch.Generator().manual_seed(batch)
    kv_lens = torch.randint(100, 2049, (batch,), generator=gen).tolist()
    attn, q, k, v = _setup(layout, page_size, [1] * batch, kv_lens, "auto", backend, kv_layout)
    ms = do_bench(lambda: attn.run(q, k, v), warmup=25, rep=200, return_mode="median")
    _, hkv, d = LAYOUTS[layout]
    nbytes = 2 * sum(kv_lens) * hkv * d * 2
    return {"kind": f"dec-{backend}-{kv_layout}", "layout": layout, "batch": batch,
            "kv_len": sum(kv_lens) // batch, "page_size": page_size, "ms": ms,
            "GB/s": nbytes / ms / 1e6}


def bench_decode_order(layout: str, batch: int, order: str, split: bool) -> dict[str, object]:
    """Decode at the offline workload's lengths with the requests in `order` (as drawn,
    longest first, shortest first), split-KV or whole-KV (one CTA per request and KV head,
    where the order is the order the GPU starts them)."""
    gen = torch.Generator().manual_seed(batch)
    kv_lens = torch.randint(100, 2049, (batch,), generator=gen).tolist()
    if order != "drawn":
        kv_lens.sort(reverse=order == "longest first")
    attn, q, k, v = _setup(layout, 16, [1] * batch, kv_lens)
    meta = _meta([1] * batch, kv_lens, 16)
    attn._plan_decode(attn._decode, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len,
                      split_kv=split)
    ms = do_bench(lambda: attn.run(q, k, v), warmup=25, rep=200, return_mode="median")
    _, hkv, d = LAYOUTS[layout]
    return {"kind": f"{'split' if split else 'whole'} {order}", "layout": layout,
            "batch": batch, "kv_len": sum(kv_lens) // batch, "page_size": 16, "ms": ms,
            "GB/s": 2 * sum(kv_lens) * hkv * d * 2 / ms / 1e6}


def workload_step(step: int) -> list[int]:
    """KV lengths of the offline workload's running requests at decode step `step` (all
    prompts taken as prefilled together): those with more than `step` output tokens."""
    prompts, outs = draw()
    return [len(p) + step for p, o in zip(prompts, outs) if o > step]


def bench_graph_decode(layout: str, step: int, variant: str) -> dict[str, object]:
    """One layer's decode attention as a CUDA-graph replay at the workload's `step`, padded
    to the engine's graph size, for a graph variant: "tc-split" / "tc-whole" (tensor-core
    kernel, KV split or not; what the engine captures), "cc-split" (CUDA-core kernel) or
    "xqa" (TensorRT-LLM's kernel, no plan; its error against the CUDA-core output is
    reported)."""
    import flashinfer
    from minisgl_worker.engine.graph import graph_batch_sizes
    hq, hkv, d = LAYOUTS[layout]
    page = 16
    kv_lens = workload_step(step)
    n = len(kv_lens)
    padded = next(s for s in graph_batch_sizes(256) if s >= n)
    lens = kv_lens + [1] * (padded - n)  # padding rows: one token (the dummy page)
    meta = _meta([1] * padded, lens, page)
    num_pages = int(meta.kv_indptr[-1])
    k = torch.randn(num_pages, page, hkv, d, device=DEV, dtype=BF16)
    v = torch.randn_like(k)
    bufs = (torch.zeros(padded + 1, dtype=torch.int32, device=DEV),
            torch.zeros(num_pages, dtype=torch.int32, device=DEV),
            torch.ones(padded, dtype=torch.int32, device=DEV))
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True, use_tensor_cores=variant.startswith("tc"),
        paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
        paged_kv_last_page_len_buffer=bufs[2])
    w.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, hq, hkv, d, page,
           q_data_type=BF16, kv_data_type=BF16, disable_split_kv=variant.endswith("whole"))
    q = torch.randn(padded, hq, d, device=DEV, dtype=BF16)
    out = torch.empty_like(q)
    w.run(q, (k, v), out=out)
    run = lambda: w.run(q, (k, v), out=out)
    err = None
    if variant == "xqa":  # TensorRT-LLM's decode kernel: block tables, no plan
        ref = out.clone()
        tables = _block_tables(meta, padded)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV).view(torch.uint32)
        xws = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
        run = lambda: flashinfer.decode.xqa_batch_decode_with_kv_cache(
            q, (k, v), xws, tables, seq_lens, max(lens), bmm1_scale=d**-0.5, out=out)
        run()
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
    nbytes = 2 * sum(kv_lens) * hkv * d * 2
    row = {"kind": f"step {step} {variant}", "layout": layout, "batch": n,
           "kv_len": sum(kv_lens) // n, "page_size": page, "ms": ms, "GB/s": nbytes / ms / 1e6}
    if err is not None:
        row["new"] = f"{err:.0e}"  # printed in the "new" column: error vs FlashInfer
    return row


def _build_xqa() -> None:
    """Compile XQA's two modules (GQA 2 and 4, bf16, page 16) in one parallel ninja run."""
    from flashinfer.jit.xqa import gen_xqa_module
    from minisgl_worker.attention.flashinfer_jit import build_jit

    build_jit([gen_xqa_module(BF16, BF16, 16, 128, group, False, BF16) for group in (2, 4)])


def _block_tables(meta: PagedKVMeta, rows: int) -> torch.Tensor:
    """FlashInfer's CSR page lists -> (rows, max pages) int32 block tables (XQA's form)."""
    indptr = meta.kv_indptr.tolist()
    width = max(b - a for a, b in itertools.pairwise(indptr))
    tables = torch.zeros(rows, width, dtype=torch.int32, device=DEV)
    for i in range(rows):
        tables[i, : indptr[i + 1] - indptr[i]] = meta.kv_indices[indptr[i] : indptr[i + 1]]
    return tables


def bench_prefill(layout: str, backend: str, reqs: int, new: int, prefix: int,
                  page_size: int) -> dict[str, object]:
    attn, q, k, v = _setup(layout, page_size, [new] * reqs, [prefix + new] * reqs, backend)
    ms = do_bench(lambda: attn.run(q, k, v), warmup=25, rep=200, return_mode="median")
    hq, _, d = LAYOUTS[layout]
    pairs = reqs * sum(prefix + j + 1 for j in range(new))
    return {"kind": f"prefill-{backend}", "layout": layout, "batch": reqs,
            "kv_len": prefix + new, "new": new, "page_size": page_size, "ms": ms,
            "TFLOP/s": 4 * hq * d * pairs / ms / 1e9}


def bench_plan(layout: str, batch: int, kv_len: int, page_size: int) -> dict[str, object]:
    attn, _, _, _ = _setup(layout, page_size, [1] * batch, [kv_len] * batch)
    meta = _meta([1] * batch, [kv_len] * batch, page_size)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        attn.plan(*meta)
    return {"kind": "plan-decode", "layout": layout, "batch": batch, "kv_len": kv_len,
            "page_size": page_size, "ms": (time.perf_counter() - t0) / 50 * 1e3}


def main() -> None:
    rows = []
    if os.environ.get("DECODE_GRAPH"):  # the graph variants over the workload's decode steps
        _build_xqa()
        for layout in LAYOUTS:
            for step in (0, 200, 400, 600, 700, 800, 850, 900, 950, 980, 1000, 1015):
                for variant in ("tc-split", "tc-whole", "cc-split", "xqa"):
                    if variant == "tc-whole" and len(workload_step(step)) <= 56:
                        continue  # the engine has whole-KV graphs from batch 64 up
                    rows.append(bench_graph_decode(layout, step, variant))
        _print(rows)
        return
    if os.environ.get("DECODE_ORDER"):  # does the order of the requests matter?
        for layout in LAYOUTS:
            for batch in (64, 128, 256):
                for split in (True, False):
                    for order in ("drawn", "longest first", "shortest first"):
                        rows.append(bench_decode_order(layout, batch, order, split))
        _print(rows)
        return
    if os.environ.get("DECODE_BACKENDS"):  # fa2 vs fa3 tensor-core decode, NHD vs HND
        for batch in (64, 128, 256):
            for backend, kv_layout in (("fa2", "NHD"), ("fa3", "NHD"), ("fa2", "HND")):
                for layout in LAYOUTS:
                    rows.append(bench_ragged_decode(layout, batch, 16, backend, kv_layout))
        _print(rows)
        return
    for layout in LAYOUTS:
        for batch in (64, 256):
            for page_size in (1, 16, 256):
                rows.append(bench_decode(layout, batch, 1024, page_size))
    for layout in LAYOUTS:
        for backend in ("fa2", "fa3"):
            for page_size in (1, 16):
                rows.append(bench_prefill(layout, backend, 8, 1024, 0, page_size))
                rows.append(bench_prefill(layout, backend, 4, 512, 2048, page_size))
    rows.append(bench_plan("qwen3-0.6b", 256, 1024, 1))
    rows.append(bench_plan("qwen3-0.6b", 256, 1024, 16))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench.json"), "w") as f:
            json.dump(rows, f, indent=1)
    _print(rows)


def _print(rows: list[dict[str, object]]) -> None:
    print(f"{'kind':<20} {'layout':<13} {'bs':>4} {'kv':>5} {'new':>5} {'page':>4} "
          f"{'ms':>8} {'GB/s | TFLOP/s':>15}")
    for r in rows:
        rate = r.get("GB/s", r.get("TFLOP/s", ""))
        print(f"{r['kind']:<20} {r['layout']:<13} {r['batch']:>4} {r['kv_len']:>5} "
              f"{r.get('new', 1):>5} {r['page_size']:>4} {r['ms']:>8.3f} "
              f"{rate if rate == '' else f'{rate:.1f}':>15}")


if __name__ == "__main__":
    main()
