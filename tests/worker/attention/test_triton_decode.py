"""The whole-KV Triton decode kernel (attention/triton_decode.py) against a float32 torch
reference, on CPU through Triton's interpreter (in a subprocess: TRITON_INTERPRET must be set
before the kernel is defined). float16, because the interpreter mishandles bf16 dots. The
GPU path (bf16, in CUDA graphs) is tests/gpu/test_flashinfer_backend.py's whole-KV case.
Each case runs over an FP8 pool too (values stored / scale; the reference reads them back
through kvcache/quant.py), as tests/gpu/test_fp8_kv.py does on the GPU, with the launch
constants' dots in the query's dtype and in fp16."""

from __future__ import annotations

import itertools
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
KV_MODES = ("fp16", "fp8", "fp8, fp16 dots")  # the pool's dtype; for FP8, the dots' dtype


def check() -> None:
    from minisgl_worker.attention.flashinfer_meta import PagedKVMeta
    from minisgl_worker.attention.triton_decode import Launch, WholeKVDecode
    from minisgl_worker.kvcache.quant import FP8, from_cache, to_cache

    from tests.gpu.paged import reference_attention

    torch.manual_seed(0)
    for (hq, hkv, d, page, lens), kv in itertools.product(CASES, KV_MODES):
        fp8 = kv != "fp16"
        pages = [-(-n // page) for n in lens]
        num_pages = sum(pages) + 3
        k = torch.randn(num_pages, page, hkv, d, dtype=torch.float16)
        v = torch.randn_like(k)
        indices = torch.randperm(num_pages, dtype=torch.int32)[: sum(pages)]
        indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages)], dtype=torch.int32)
        # q as the engine passes it: a strided view of the fused qkv projection's output;
        # bf16 (the GPU's dtype) where no dot runs in it
        q_dtype = torch.bfloat16 if kv == "fp8, fp16 dots" else torch.float16
        qkv = torch.randn(len(lens), (hq + 2 * hkv) * d, dtype=q_dtype)
        q = qkv[:, : hq * d].view(len(lens), hq, d)
        launch = (Launch(32, 4, 2, fp16_dots=True, max_registers=128)
                  if kv == "fp8, fp16 dots" else None)
        attn = WholeKVDecode(len(lens), hq, hkv, d, page, d**-0.5, indices.clone(), launch)
        attn.plan(indptr, last)
        order = attn._meta[2 * len(lens) + 1 :].tolist()
        assert [lens[i] for i in order] == sorted(lens, reverse=True), order
        scales = (0.02, 0.005)
        if fp8:  # the pool holds value / scale; the reference reads it back
            k, v = to_cache(k, FP8, scales[0]), to_cache(v, FP8, scales[1])
            out = attn.run(q, (k, v), k_scale=scales[0], v_scale=scales[1])
            k, v = from_cache(k, torch.float32, scales[0]), from_cache(v, torch.float32, scales[1])
        else:
            out = attn.run(q, (k, v))
        meta = PagedKVMeta(torch.arange(len(lens) + 1, dtype=torch.int32), indptr, indices, last)
        ref = reference_attention(q, k, v, meta, page)
        err = float((out.float() - ref).norm() / ref.norm())
        print(f"heads {hq}/{hkv} d {d} page {page} lens {lens} {kv} KV: relative error "
              f"{err:.1e}")
        assert err < 5e-3, err


def test_whole_kv_decode_matches_torch_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.worker.attention.test_triton_decode"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("relative error") == len(KV_MODES) * len(CASES), done.stdout


def test_head_dims_the_kernel_takes() -> None:
    """The decode graphs only build whole-KV variants for these (engine/graph.py); other
    head dims keep FlashInfer's split-KV graphs at every batch size."""
    from minisgl_worker.attention.triton_decode import supports

    assert [d for d in (8, 16, 64, 80, 96, 128, 256) if supports(d)] == [16, 64, 128, 256]


if __name__ == "__main__":
    check()
