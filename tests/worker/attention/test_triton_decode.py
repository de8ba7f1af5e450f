"""The paged Triton attention kernel (attention/triton_decode.py) against a float32 torch
reference, on CPU through Triton's interpreter (in a subprocess: TRITON_INTERPRET must be set
before the kernel is defined): decode batches (one token a request, as the decode graphs run
it) and mixed batches (decodes and prompt chunks cut into causal segments, as the mixed-step
graphs run it). float16, because the interpreter mishandles bf16 dots. The GPU path (bf16,
in CUDA graphs) is tests/gpu/test_flashinfer_backend.py's whole-KV case and
tests/gpu/test_models.py's mixed graphs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")  # a dependency of Linux x86-64 torch wheels

ROOT = Path(__file__).parents[3]  # the repository: the subprocess imports tests.gpu.paged
CASES = [  # (num_qo_heads, num_kv_heads, head_dim, page_size, kv lengths)
    (16, 8, 128, 16, [1, 17, 128, 129, 300]),  # Qwen3-0.6B's heads; 1: a padding row
    (9, 3, 64, 1, [200, 1, 5]),  # SmolLM2's, page size 1
    (32, 8, 128, 16, [64, 640]),  # Llama-3.1-8B's
]
MIXED = [  # (num_qo_heads, num_kv_heads, head_dim, page_size, prefix lengths, query lengths)
    (16, 8, 128, 16, [300, 0, 7, 140, 0], [1, 13, 1, 20, 130]),  # group 2: 8-token segments
    (32, 8, 128, 16, [5, 64, 0], [1, 9, 3]),  # group 4: 4-token segments
    (9, 3, 64, 1, [0, 50], [21, 1]),  # group 3: 5-token segments, rows 15 of 16
]


def paged(lens: list[int], page: int, hkv: int, d: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K and V pools and requests of `lens` tokens on shuffled pages -> (k, v, page
    ids, their indptr, tokens in each last page)."""
    pages = [-(-n // page) for n in lens]
    num_pages = sum(pages) + 3
    k = torch.randn(num_pages, page, hkv, d, dtype=torch.float16)
    v = torch.randn_like(k)
    indices = torch.randperm(num_pages, dtype=torch.int32)[: sum(pages)]
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages)], dtype=torch.int32)
    return k, v, indices, indptr, last


def strided_q(tokens: int, hq: int, hkv: int, d: int) -> torch.Tensor:
    """q as the engine passes it: a strided view of the fused qkv projection's output."""
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, dtype=torch.float16)
    return qkv[:, : hq * d].view(tokens, hq, d)


def check() -> None:
    from minisgl_worker.attention.flashinfer_backend import PagedKVMeta
    from minisgl_worker.attention.triton_decode import SegmentAttention, WholeKVDecode

    from tests.gpu.paged import reference_attention

    torch.manual_seed(0)
    for hq, hkv, d, page, lens in CASES:
        k, v, indices, indptr, last = paged(lens, page, hkv, d)
        q = strided_q(len(lens), hq, hkv, d)
        attn = WholeKVDecode(len(lens), hq, hkv, d, page, d**-0.5, indices.clone())
        attn.plan(indptr, last)
        out = attn.run(q, (k, v))
        meta = PagedKVMeta(torch.arange(len(lens) + 1, dtype=torch.int32), indptr, indices, last)
        ref = reference_attention(q, k, v, meta, page)
        err = float((out.float() - ref).norm() / ref.norm())
        print(f"heads {hq}/{hkv} d {d} page {page} lens {lens}: relative error {err:.1e}")
        assert err < 5e-3, err
    for hq, hkv, d, page, prefix, q_lens in MIXED:
        lens = [p + n for p, n in zip(prefix, q_lens)]
        k, v, indices, indptr, last = paged(lens, page, hkv, d)
        q = strided_q(sum(q_lens), hq, hkv, d)
        grid = sum(q_lens) + 3  # programs past the segments return at once
        attn = SegmentAttention(grid, len(lens), hq, hkv, d, page, d**-0.5, indices.clone(),
                                causal=True)
        attn.plan_segments(indptr.numpy(), torch.tensor(lens).numpy(),
                           torch.tensor(q_lens).numpy(), grid)
        out = attn.run(q, (k, v))
        qo = torch.tensor([0] + q_lens).cumsum(0, dtype=torch.int32)
        ref = reference_attention(q, k, v, PagedKVMeta(qo, indptr, indices, last), page)
        err = float((out.float() - ref).norm() / ref.norm())
        print(f"mixed heads {hq}/{hkv} d {d} page {page} q {q_lens}: relative error {err:.1e}")
        assert err < 5e-3, err


def test_decode_and_mixed_segments_match_torch_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.worker.attention.test_triton_decode"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("relative error") == len(CASES) + len(MIXED), done.stdout


def test_segments_cover_each_query_row_once_longest_first() -> None:
    from minisgl_worker.attention.triton_decode import plan_segments

    kv_lens, q_lens = [300, 13, 8, 160, 130, 1], [1, 13, 1, 20, 130, 0]
    req, q0, n, keys = plan_segments(kv_lens, q_lens, 8)
    assert list(keys) == sorted(keys, reverse=True) and n.min() >= 1 and n.max() <= 8
    rows = sorted(r for start, m in zip(q0, n) for r in range(start, start + m))
    assert rows == list(range(sum(q_lens)))  # the last request has no query: no segment
    first_row = [sum(q_lens[:i]) for i in range(len(q_lens))]
    for r, start, m, key in zip(req, q0, n, keys):  # a segment sees up to its last token
        assert key == kv_lens[r] - q_lens[r] + (start - first_row[r]) + m
    assert sum(req == 4) == 17 and sum(req == 0) == 1  # ceil(130 / 8) segments, and one


def test_head_dims_the_kernel_takes() -> None:
    """The decode graphs only build whole-KV variants for these (engine/graph.py); other
    head dims keep FlashInfer's split-KV graphs at every batch size."""
    from minisgl_worker.attention.triton_decode import supports

    assert [d for d in (8, 16, 64, 80, 96, 128, 256) if supports(d)] == [16, 64, 128, 256]


if __name__ == "__main__":
    check()
