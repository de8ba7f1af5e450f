"""Where does the whole-KV decode kernel lose against the read floor (4.09 TB/s for K and V
fed to dots, benches/read_floor.py)? Variants of attention/triton_decode.py's kernel, timed
at the offline workload's steps and at 256 x 512 tokens in CUDA-graph replays against the
worker's own `WholeKVDecode`:

- "table": the host writes each program's (request, first page, KV length) in launch order,
  so a program's start is one load and then its page ids, not the order, then the request's
  page range, then its page ids (three dependent loads before the first KV byte, now two);
- "table, peeled": besides, the full 128-token tiles run without masks and the last,
  part-filled one as a separate masked step;
- "table, tail in 32s": besides, the part-filled rest runs as 32-token tiles (it costs about
  a full tile's time when read as one 128-token tile: RESULTS.md, "Decode attention
  against the read floor");
- "rotated loop": tile i+1's q K^T issued before tile i's softmax and S V;
- diagnostics with wrong output: the two dots chained without the softmax, q K^T beside an
  independent dot with V, and K and V each into a dot with a constant (read_floor.py's
  dots) in this kernel's loop; at 256 x 512 tokens also loops of a fixed trip count.

    python benches/decode_prologue.py [--layout llama-3.1-8b]   # on the GPU

Result on the H200 (RESULTS.md, "The per-program start and the last tile, tested"): the
table, peeled and tail variants within 1% of the worker's kernel, the rotated loop ~30%
slower; read_floor's dots in this loop reach 3.9 TB/s, 4.0 with a fixed trip count.
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from minisgl_worker.attention.triton_decode import (
    BLOCK_T,
    LOG2E,
    NUM_STAGES,
    NUM_WARPS,
    WholeKVDecode,
    gather_tile,
    load_query_group,
    online_softmax_step,
    softmax_init,
    softmax_update,
    store_output,
)

sys.path.insert(0, str(Path(__file__).parent))
from triton_decode import paged_batch, reference


@triton.jit
def _steps(q, k_ptr, v_ptr, indices_ptr, first_page, start, end, h, d, scale_log2, m_i, l_i,
           acc, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, TILE: tl.constexpr,
           MASKED: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: attention. Diagnostics (wrong output): 1, the two dots chained as attention
    chains them (S = q K^T, then S V), no softmax; 2, q K^T beside an independent dot with V;
    3, K and V each into its own dot with a constant, as read_floor.py's dot-fed read."""
    ones = tl.full((q.shape[0], TILE), 1.0, q.dtype)
    for t0 in range(start, end, TILE):
        t = t0 + tl.arange(0, TILE)
        if MASKED:
            valid = t < end
        else:
            valid = tl.full((TILE,), 1, tl.int1)
        k, v = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, valid, h, d, HKV, D, PAGE)
        if MODE == 0:
            m_i, l_i, acc = online_softmax_step(q, k, v, valid, scale_log2, m_i, l_i, acc)
        elif MODE == 1:
            acc = tl.dot(tl.dot(q, tl.trans(k)).to(v.dtype), v, acc)
            l_i += 1.0
        elif MODE == 2:
            l_i += tl.sum(tl.dot(q, tl.trans(k)), 1)
            acc = tl.dot(ones, v, acc)
        else:
            acc = tl.dot(ones, v, tl.dot(ones, k, acc))
            l_i += 1.0
    return m_i, l_i, acc


@triton.jit
def _program(table_ptr):
    """This program's (request, first page, KV length) from the host-written table."""
    p = tl.program_id(0)
    entry = table_ptr + 3 * p
    return tl.load(entry), tl.load(entry + 1), tl.load(entry + 2)


@triton.jit
def _table_kernel(q_ptr, k_ptr, v_ptr, out_ptr, indices_ptr, table_ptr, scale_log2,
                  q_stride_t, q_stride_h, HKV: tl.constexpr, GROUP: tl.constexpr,
                  GP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
                  TAIL: tl.constexpr, PEEL: tl.constexpr,
                  MODE: tl.constexpr, FIXED: tl.constexpr = 0):
    h = tl.program_id(1)
    b, first_page, kv_len = _program(table_ptr)
    q, heads, rows = load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP, GP, D)
    d = tl.arange(0, D)
    m_i, l_i, acc = softmax_init(GP, D)
    if PEEL:
        full = kv_len // BLOCK * BLOCK
        m_i, l_i, acc = _steps(q, k_ptr, v_ptr, indices_ptr, first_page, 0, full, h, d,
                               scale_log2, m_i, l_i, acc, HKV, D, PAGE, BLOCK, False, MODE)
        m_i, l_i, acc = _steps(q, k_ptr, v_ptr, indices_ptr, first_page, full, kv_len, h, d,
                               scale_log2, m_i, l_i, acc, HKV, D, PAGE, TAIL, True, MODE)
    elif FIXED:  # every request FIXED tokens long: a loop of a known trip count
        m_i, l_i, acc = _steps(q, k_ptr, v_ptr, indices_ptr, first_page, 0, FIXED, h, d,
                               scale_log2, m_i, l_i, acc, HKV, D, PAGE, BLOCK, False, MODE)
    else:
        m_i, l_i, acc = _steps(q, k_ptr, v_ptr, indices_ptr, first_page, 0, kv_len, h, d,
                               scale_log2, m_i, l_i, acc, HKV, D, PAGE, BLOCK, True, MODE)
    store_output(out_ptr, acc, l_i, b, heads, rows, HKV * GROUP, D)


@triton.jit
def _rotated_kernel(q_ptr, k_ptr, v_ptr, out_ptr, indices_ptr, table_ptr, scale_log2,
                    q_stride_t, q_stride_h, HKV: tl.constexpr, GROUP: tl.constexpr,
                    GP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Attention with the loop rotated by hand: tile i+1's q K^T is issued before tile i's
    softmax and S V, so the two dots of an iteration no longer wait on each other."""
    h = tl.program_id(1)
    b, first_page, kv_len = _program(table_ptr)
    q, heads, rows = load_query_group(q_ptr, b, h, q_stride_t, q_stride_h, GROUP, GP, D)
    d = tl.arange(0, D)
    m_i, l_i, acc = softmax_init(GP, D)
    t = tl.arange(0, BLOCK)
    k, v = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, t < kv_len, h, d, HKV, D, PAGE)
    s = tl.where((t < kv_len)[None, :], tl.dot(q, tl.trans(k)) * scale_log2, float("-inf"))
    for t0 in range(BLOCK, kv_len, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        k, v_next = gather_tile(k_ptr, v_ptr, indices_ptr, first_page, t, t < kv_len, h, d,
                                HKV, D, PAGE)
        s_next = tl.where((t < kv_len)[None, :], tl.dot(q, tl.trans(k)) * scale_log2,
                          float("-inf"))
        m_i, l_i, acc = softmax_update(s, v, m_i, l_i, acc)
        s, v = s_next, v_next
    m_i, l_i, acc = softmax_update(s, v, m_i, l_i, acc)
    store_output(out_ptr, acc, l_i, b, heads, rows, HKV * GROUP, D)


def program_table(indptr: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """(request, first page, KV length) per program, longest request first, int32 flat."""
    lens_h, indptr_h = lens.cpu().numpy(), indptr.cpu().numpy()
    order = np.argsort(-lens_h, kind="stable")
    table = np.stack([order, indptr_h[order], lens_h[order]], axis=1).astype(np.int32)
    return torch.from_numpy(table.reshape(-1)).to(lens.device)


def run_table(q, k, v, indices, table, out, peel: bool = False, tail: int = BLOCK_T,
              mode: int = 0, rotated: bool = False, fixed: int = 0) -> None:
    bs, hq, d = q.shape
    hkv = k.shape[2]
    group = hq // hkv
    args = (q, k, v, out, indices, table, LOG2E / math.sqrt(d), q.stride(0), q.stride(1))
    shape = {"HKV": hkv, "GROUP": group, "GP": max(16, triton.next_power_of_2(group)), "D": d,
             "PAGE": k.shape[1], "BLOCK": BLOCK_T, "num_warps": NUM_WARPS,
             "num_stages": NUM_STAGES}
    if rotated:
        _rotated_kernel[(bs, hkv)](*args, **shape)
    else:
        _table_kernel[(bs, hkv)](*args, TAIL=tail, PEEL=peel, MODE=mode, FIXED=fixed, **shape)


def worker_kernel(q, k, v, indptr, indices, lens):
    """The worker's WholeKVDecode, planned for this batch -> a run() closure."""
    bs, hq, d = q.shape
    page = k.shape[1]
    attn = WholeKVDecode(bs, hq, k.shape[2], d, page, 1 / math.sqrt(d), indices)
    pages = torch.diff(indptr).cpu()
    last = (lens.cpu() - (pages - 1) * page).to(torch.int32)
    attn.plan(indptr.cpu(), last)
    torch.cuda.synchronize()
    out = torch.empty_like(q)
    return lambda: attn.run(q, (k, v), out), out


VARIANTS = {  # name: run_table's options (the first two rows are the ones recorded first)
    "table": {}, "table, peeled": {"peel": True}, "table, tail in 32s": {"peel": True, "tail": 32},
    "table, tail in 16s": {"peel": True, "tail": 16},
    "rotated loop": {"rotated": True},
    "dots chained, no softmax": {"mode": 1}, "dots apart, no softmax": {"mode": 2},
    "K and V into dots with a constant (read floor)": {"mode": 3},
}


def main() -> None:
    from attention_kernels import workload_step
    from stream_overlap import capture
    from triton.testing import do_bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama-3.1-8b"])
    args = p.parse_args()
    hq = {"qwen3-0.6b": 16, "llama-3.1-8b": 32}[args.layout]
    print(f"\n{args.layout}, {torch.cuda.get_device_name()}\n")
    print("| lengths (running) | kernel | us | GB/s | error vs torch |")
    print("| --- | --- | ---: | ---: | ---: |")
    cases = [(f"step {s}", workload_step(s)) for s in (0, 400, 900)] + [("all 512", [512] * 256)]
    for case, kv_lens in cases:
        batch = paged_batch(kv_lens, hq, 8, 128, 16, torch.device("cuda"))
        q, k, v, indptr, indices, lens = batch
        some = list(range(0, len(kv_lens), max(1, len(kv_lens) // 8)))
        ref = torch.stack([reference(q[r : r + 1], k, v, indptr[r : r + 2], indices,
                                     lens[r : r + 1])[0] for r in some])
        table = program_table(indptr, lens)
        out = torch.empty_like(q)
        runs = [("worker (WholeKVDecode)", *worker_kernel(*batch), True)]
        variants = dict(VARIANTS)
        if case == "all 512":  # the same loops with a trip count known at compile time
            variants.update({"table, fixed 512": {"fixed": 512},
                             "read floor dots, fixed 512": {"mode": 3, "fixed": 512}})
        for name, options in variants.items():
            fn = partial(run_table, q, k, v, indices, table, out, **options)
            runs.append((name, fn, out, options.get("mode", 0) == 0))
        nbytes = 2 * sum(kv_lens) * 8 * 128 * 2
        for name, fn, o, exact in runs:
            fn()
            err = ((o[some].float() - ref).abs().max() / ref.abs().max()).item()
            ms = do_bench(capture(fn).replay, warmup=10, rep=100, return_mode="median")
            print(f"| {case} ({len(kv_lens)}) | {name} | {1e3 * ms:.1f} | "
                  f"{nbytes / ms / 1e6:.0f} | {f'{err:.1e}' if exact else ''} |")


if __name__ == "__main__":
    main()
