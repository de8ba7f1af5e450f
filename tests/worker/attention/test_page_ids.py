"""The decode graphs' page-id gather (attention/page_ids.py) against `paged_kv_meta`'s torch
ops, padding requests included, on CPU through Triton's interpreter (in a subprocess:
TRITON_INTERPRET must be set before the kernel is defined), directly and through
`gather_pages`. On the GPU it runs in every decode-graph test (tests/gpu,
tests/worker/test_gpu.py) through `plan_padded`."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # a dependency of Linux x86-64 torch wheels

ROOT = Path(__file__).parents[3]
CASES = 12


def check() -> None:
    from minisgl_worker.attention.flashinfer_meta import gather_pages, paged_kv_meta
    from minisgl_worker.attention.page_ids import gather_page_ids

    rng = random.Random(0)
    for case in range(CASES):
        page_size = (1, 4, 16)[case % 3]
        table = torch.randint(0, 10_000, (12, 600), dtype=torch.int32)
        rows = rng.sample(range(12), rng.randint(0, 8))
        lens = [rng.randint(1, 600) for _ in rows]  # up to 600 pages: several tiles
        pad = rng.randint(0, 3)
        dummy = 10_001
        meta = paged_kv_meta(table, rows, lens, [1] * len(rows), page_size)
        expect = torch.cat([meta.kv_indices, torch.full((pad,), dummy, dtype=torch.int32)])
        pages = np.array([-(-n // page_size) for n in lens] + [1] * pad, dtype=np.int64)
        starts = np.cumsum(pages) - pages
        out = torch.full((int(pages.sum()) + 5,), -7, dtype=torch.int32)  # 5 past the end
        sizes = torch.from_numpy(np.stack([np.array(rows + [-1] * pad, dtype=np.int64), pages,
                                           starts]))
        gather_page_ids(table, sizes, page_size, dummy, out)
        assert torch.equal(out[: len(expect)], expect), (case, out, expect)
        assert (out[len(expect):] == -7).all(), "wrote past the batch's page ids"
        # gather_pages (the decode and mixed-step graphs' plans): the same ids, and the CSR
        # sizes the kernels are planned with
        again = torch.full_like(out, -7)
        indptr, last = gather_pages(table, rows + [-1] * pad, lens + [1] * pad, page_size,
                                    dummy, again)
        assert torch.equal(again, out), (case, again, out)
        assert indptr.dtype == last.dtype == np.int32
        assert indptr.tolist() == [0, *np.cumsum(pages).tolist()], (case, indptr)
        assert last.tolist() == [n - (p - 1) * page_size
                                 for n, p in zip(lens + [1] * pad, pages)], (case, last)
        print(f"case {case}: {len(rows)} requests + {pad} padding, page {page_size}: equal")


def test_page_ids_match_paged_kv_meta_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.worker.attention.test_page_ids"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": equal") == CASES, done.stdout


if __name__ == "__main__":
    check()
