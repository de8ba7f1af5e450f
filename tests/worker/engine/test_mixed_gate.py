"""Which batches the whole mixed-step graphs take (engine/mixed.py's `can_run`; the graphs
themselves are CUDA-only and tested in tests/gpu/test_models.py). Host logic only."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from minisgl_worker.core import Batch, Req
from minisgl_worker.engine.mixed import MixedGraphs, min_requests
from minisgl_worker.engine.piecewise import piece_sizes
from minisgl_worker.protocol import SamplingParams


def _batch(decode_lens: list[int], chunks: list[int]) -> Batch:
    """Decodes holding `decode_lens` tokens (their new one included), then prompt chunks of
    `chunks` tokens, in the scheduler's order."""
    reqs, extend = [], []
    for i, n in enumerate(decode_lens):
        req = Req(i, [1] * (n - 1), SamplingParams())
        req.output_ids, req.cached_len, req.device_len = [2], n - 1, n
        reqs.append(req)
        extend.append(1)
    for j, n in enumerate(chunks):
        req = Req(100 + j, [1] * (n + 5), SamplingParams())
        req.device_len = n
        reqs.append(req)
        extend.append(n)
    t = sum(extend)
    zeros = torch.zeros(t, dtype=torch.long)
    return Batch(reqs=reqs, input_ids=zeros, positions=zeros, out_loc=zeros, extend_lens=extend)


def _takes(batch: Batch, group: int = 4) -> bool:
    """Through the gate of Llama-3.1-8B's layout (8 KV heads) on an H200's 132 SMs."""
    graphs = SimpleNamespace(sizes=piece_sizes(256), group=group,
                             min_requests=min_requests(132, 8))
    return MixedGraphs.can_run(graphs, batch)  # type: ignore[arg-type]


def test_fa2_leaves_long_kv_unsplit_from_two_ctas_a_sm_per_kv_head() -> None:
    assert min_requests(132, 8) == 34 and min_requests(132, 2) == 133


def test_many_decodes_beside_short_chunks_take_the_graphs() -> None:
    assert _takes(_batch([500] * 34, [100]))  # 35 requests, 134 tokens: 15.3 packed rows
    assert _takes(_batch([400, 600] * 40, [60, 40, 30, 20, 5, 5, 5]))  # any chunk count
    assert _takes(_batch([100] * 60 + [4000] * 4, [100]))  # uneven: FA2 leaves it unsplit
    assert _takes(_batch([500] * 160, [96]))  # the capped step: 256 tokens, 161 requests


def test_the_piecewise_graphs_keep_batches_whose_eager_plan_differs() -> None:
    assert not _takes(_batch([500] * 32, [100]))  # 33 requests: FA2 may split long KV
    assert not _takes(_batch([500] * 40, [200]))  # 240 x 4 packed rows > 16 x 41: tile 64
    assert _takes(_batch([500] * 40, [200]), group=2)  # Qwen3's group: 480 <= 656
    assert not _takes(_batch([], [100, 20]))  # prompt chunks alone: the eager plan tiles 128
    assert not _takes(_batch([500] * 200, [100]))  # 300 tokens: no size
