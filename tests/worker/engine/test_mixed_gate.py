"""Which batches the whole mixed-step graphs take (engine/mixed.py's `can_run`; the graphs
themselves are CUDA-only and tested in tests/gpu/test_models.py). Host logic only."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from minisgl_worker.core import Batch, Req
from minisgl_worker.engine.mixed import MAX_CHUNKS, MIN_DECODES, MixedGraphs
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


def _takes(batch: Batch) -> bool:
    graphs = SimpleNamespace(sizes=piece_sizes(256))
    return MixedGraphs.can_run(graphs, batch)  # type: ignore[arg-type]


def test_even_decodes_beside_a_few_chunks_take_the_graphs() -> None:
    assert _takes(_batch([500] * MIN_DECODES, [100]))
    assert _takes(_batch([400, 600] * 40, [60, 40, 30, 20]))  # MAX_CHUNKS chunks, 230 tokens
    assert _takes(_batch([], [100, 20]))  # prompt chunks alone


def test_the_piecewise_graphs_keep_what_the_whole_kv_kernel_does_not_suit() -> None:
    assert not _takes(_batch([500] * (MIN_DECODES - 1), [100]))  # too few decodes
    assert not _takes(_batch([100] * 60 + [2000] * 4, [100]))  # longest > twice the mean
    assert not _takes(_batch([500] * 64, [20] * (MAX_CHUNKS + 1)))  # too many chunks
    assert not _takes(_batch([500] * 200, [100]))  # 300 tokens: no size
    assert not _takes(_batch([500] * 64, []))  # a decode batch is the decode graphs'
