"""How fast can the H200 read a layer's KV at all? The floor decode attention is judged by.

Decode attention reads one layer's K and V (~600 MB at the offline workload's first step)
through a page table. Both FlashInfer's tensor-core decode and triton_decode.py (beside this
file) stopped at ~3.6 TB/s there, and `torch.sum` over the same bytes reaches 3.72 TB/s. This
bench asks whether that is the memory system or the kernels: Triton read-only kernels (each
program sums what it reads into one float) over the same bytes, in the access patterns
attention uses:

- contiguous: each program streams CHUNK consecutive bytes;
- pages: each program reads whole 32 KB pages (16 tokens x 8 heads x 128, bf16) in a
  shuffled order, 32 pages a program (a 512-token request);
- nhd-head: one program per (32 pages, KV head) reads its head's 256 B rows, 2 KB apart
  (the pool's layout, what an attention program per (request, head) reads);
- hnd-head: the same with the head's 16 rows contiguous (4 KB a page).

CUDA-graph replays, median of triton's do_bench. Usage: python benches/kernels/read_floor.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import capture

PAGE, HKV, D = 16, 8, 128
PAGES_PER_PROGRAM = 32


@triton.jit
def _contiguous(x_ptr, out_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for off in range(0, CHUNK, BLOCK):
        acc += tl.load(x_ptr + i.to(tl.int64) * CHUNK + off + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + i, tl.sum(acc, 0))


@triton.jit
def _gather(x_ptr, ids_ptr, out_ptr, PER: tl.constexpr, ROWS: tl.constexpr,
            ROW_STRIDE: tl.constexpr, PAGE_ELEMS: tl.constexpr, HEAD_STRIDE: tl.constexpr,
            PAGES_AT_ONCE: tl.constexpr):
    """Program (i, h) reads pages ids[i*PER : (i+1)*PER]; of each, ROWS rows of D elements,
    ROW_STRIDE apart, starting at h * HEAD_STRIDE; PAGES_AT_ONCE pages a load."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, PAGES_AT_ONCE * ROWS)
    d = tl.arange(0, 128)
    acc = tl.zeros((PAGES_AT_ONCE * ROWS, 128), tl.float32)
    for p0 in range(0, PER, PAGES_AT_ONCE):
        page = tl.load(ids_ptr + i * PER + p0 + r // ROWS).to(tl.int64)
        row = page * PAGE_ELEMS + h * HEAD_STRIDE + (r % ROWS) * ROW_STRIDE
        acc += tl.load(x_ptr + row[:, None] + d[None, :]).to(tl.float32)
    tl.store(out_ptr + i * tl.num_programs(1) + h, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def _gather_kv(x_ptr, ids_ptr, out_ptr, PER: tl.constexpr, PAGE_ELEMS: tl.constexpr,
               V_OFFSET: tl.constexpr, PAGES_AT_ONCE: tl.constexpr, DOT: tl.constexpr):
    """nhd-head over K and V: program (i, h) reads head h's rows of pages ids[i*PER:...]
    at offset 0 (K) and V_OFFSET (V), as attention does. DOT: the tiles feed tensor-core
    dots (through shared memory, as in attention) instead of a register sum."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.arange(0, PAGES_AT_ONCE * 16)
    d = tl.arange(0, 128)
    acc = tl.zeros((PAGES_AT_ONCE * 16, 128), tl.float32)
    acc16 = tl.zeros((16, 128), tl.float32)
    ones = tl.full((16, PAGES_AT_ONCE * 16), 1.0, x_ptr.dtype.element_ty)
    for p0 in range(0, PER, PAGES_AT_ONCE):
        page = tl.load(ids_ptr + i * PER + p0 + r // 16).to(tl.int64)
        row = page * PAGE_ELEMS + h * 128 + (r % 16) * 1024
        k = tl.load(x_ptr + row[:, None] + d[None, :])
        v = tl.load(x_ptr + V_OFFSET + row[:, None] + d[None, :])
        if DOT:
            acc16 = tl.dot(ones, k, acc16)
            acc16 = tl.dot(ones, v, acc16)
        else:
            acc += k.to(tl.float32) + v.to(tl.float32)
    total = tl.sum(tl.sum(acc16, 1), 0) if DOT else tl.sum(tl.sum(acc, 1), 0)
    tl.store(out_ptr + i * tl.num_programs(1) + h, total)


def _time(fn) -> float:
    return do_bench(capture(fn).replay, warmup=10, rep=100, return_mode="median")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    dev = torch.device("cuda")
    pages = 18_432  # 18,432 x 32 KB = 604 MB: K and V of one layer at the workload's step 0
    x = torch.randn(pages, PAGE, HKV, D, dtype=torch.bfloat16, device=dev)
    nbytes = x.numel() * 2
    ids = torch.randperm(pages, dtype=torch.int32, device=dev)
    rows: list[tuple[str, float]] = []
    rows.append(("torch.sum", _time(lambda: x.sum())))
    y = torch.empty_like(x)
    rows.append(("copy (bytes read + written)", _time(lambda: y.copy_(x)) / 2))
    flat = x.view(-1)
    for chunk, block, warps in ((32768, 4096, 4), (262144, 4096, 4), (262144, 8192, 8),
                                (1 << 20, 8192, 8)):
        out = torch.empty(flat.numel() // chunk, device=dev)
        fn = lambda c=chunk, b=block, w=warps, o=out: _contiguous[(o.numel(),)](
            flat, o, CHUNK=c, BLOCK=b, num_warps=w)
        rows.append((f"contiguous, {2 * chunk >> 10} KB a program, {warps} warps", _time(fn)))
    programs = pages // PAGES_PER_PROGRAM
    page_elems = PAGE * HKV * D
    for name, heads, rows_, row_stride, head_stride in (
        ("pages", 1, PAGE * HKV, D, 0),
        ("nhd-head", HKV, PAGE, HKV * D, D),
        ("hnd-head", HKV, PAGE, D, PAGE * D),
    ):
        configs = ((1, 8, 2), (1, 8, 3)) if name == "pages" else ((2, 4, 2), (4, 4, 2), (4, 8, 3))
        for at_once, warps, stages in configs:  # a whole page is already a 32 KB tile
            out = torch.empty(programs * heads, device=dev)
            fn = lambda h=heads, r=rows_, rs=row_stride, hs=head_stride, a=at_once, w=warps, \
                s=stages, o=out: _gather[(programs, h)](
                    flat, ids, o, PER=PAGES_PER_PROGRAM, ROWS=r, ROW_STRIDE=rs,
                    PAGE_ELEMS=page_elems, HEAD_STRIDE=hs, PAGES_AT_ONCE=a, num_warps=w,
                    num_stages=s)
            rows.append((f"{name}, {at_once} pages a load, {warps} warps, {stages} stages",
                         _time(fn)))
    half = pages // 2  # K in the first half of the pages, V in the second (the pool's way)
    for name, page_stride, v_offset, n in (
        ("K and V apart", page_elems, half * page_elems, half),
        ("K and V in one page", 2 * page_elems, page_elems, half),
    ):
        kv_ids = torch.randperm(n, dtype=torch.int32, device=dev)
        for at_once, warps, stages, dot in ((4, 8, 3, False), (8, 4, 2, True),
                                            (8, 4, 3, True), (4, 4, 2, True)):
            out = torch.empty(n // PAGES_PER_PROGRAM * HKV, device=dev)
            fn = lambda ps=page_stride, vo=v_offset, a=at_once, w=warps, s=stages, dt=dot, \
                o=out, i=kv_ids, n=n: _gather_kv[(n // PAGES_PER_PROGRAM, HKV)](
                    flat, i, o, PER=PAGES_PER_PROGRAM, PAGE_ELEMS=ps, V_OFFSET=vo,
                    PAGES_AT_ONCE=a, DOT=dt, num_warps=w, num_stages=s)
            label = (f"nhd-head, {name}, {16 * at_once} tokens a load, {warps} warps, "
                     f"{stages} stages{', into dots' if dot else ''}")
            rows.append((label, _time(fn)))
    print(f"\n{nbytes / 1e6:.0f} MB, {torch.cuda.get_device_name()}\n")
    print("| pattern | us | TB/s |")
    print("| --- | ---: | ---: |")
    for name, ms in rows:
        print(f"| {name} | {1e3 * ms:.1f} | {nbytes / ms / 1e9:.2f} |")


if __name__ == "__main__":
    main()
