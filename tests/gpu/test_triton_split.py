"""Our Triton decode kernel split (attention/triton_decode.py) at every split count up to
MAX_SPLITS, eager and replayed in a CUDA graph, against the float32 reference: the real head
layouts and the model tests' qwen2 (4 query heads, 1 KV head, head_dim 128), whose 32 splits
at head_dim 128 no real layout reaches at the batch sizes the graph tests use."""

from __future__ import annotations

import pytest
import torch
from minisgl_worker.attention.triton_decode import MAX_SPLITS, TritonDecode

from .paged import LAYOUTS, random_batch, reference_attention, rel_err

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16 = torch.bfloat16
SPLIT_LAYOUTS = {**LAYOUTS, "qwen2-test": (4, 1, 128)}
SPLIT_COUNTS = [2**i for i in range(1, MAX_SPLITS.bit_length())]  # 2 .. MAX_SPLITS


def _check(decode: TritonDecode, caches: tuple[torch.Tensor, torch.Tensor], page_size: int,
           longest: int, graph: bool) -> None:
    """Plan a random batch of lengths 1..longest, attend (eager, or by replaying a graph
    captured at a short batch), compare with the reference."""
    bs, num_pages = decode.bs, caches[0].shape[0]

    def plan(longest: int):
        lens = torch.randint(1, longest + 1, (bs,)).tolist()
        batch = random_batch([1] * bs, [n - 1 for n in lens], page_size, num_pages, DEV)
        decode.indices[: batch.meta.kv_indices.numel()].copy_(batch.meta.kv_indices)
        decode.plan(batch.meta.kv_indptr, batch.meta.kv_last_page_len)
        return batch

    q = torch.randn(bs, decode.hq, decode.d, device=DEV, dtype=BF16)
    if graph:
        plan(16)
        decode.run(q, caches)  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = decode.run(q, caches)
    batch = plan(longest)
    if graph:
        out.fill_(float("nan"))
        g.replay()
    else:
        out = decode.run(q, caches)
    torch.cuda.synchronize()
    err = rel_err(out, reference_attention(q, *caches, batch.meta, page_size))
    assert err < 1e-2, (decode.splits, longest, err)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("splits", SPLIT_COUNTS)
@pytest.mark.parametrize("layout", list(SPLIT_LAYOUTS))
def test_split_decode_matches_reference(layout: str, splits: int, graph: bool) -> None:
    hq, hkv, d = SPLIT_LAYOUTS[layout]
    page_size, max_len = 16, 4096
    for bs in (1, 8):
        num_pages = bs * (max_len // page_size) + 8
        caches = (torch.randn(num_pages, page_size, hkv, d, device=DEV, dtype=BF16),
                  torch.randn(num_pages, page_size, hkv, d, device=DEV, dtype=BF16))
        indices = torch.zeros(num_pages, dtype=torch.int32, device=DEV)
        decode = TritonDecode(bs, hq, hkv, d, page_size, d**-0.5, indices, splits=splits)
        for longest in (max_len, 100):  # splits of many tiles; most splits empty
            _check(decode, caches, page_size, longest, graph)
