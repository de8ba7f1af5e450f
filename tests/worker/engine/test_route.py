"""The route table (engine/route.py): which way each batch shape goes, pinned in one place.
The graphs themselves are CUDA-only (tests/gpu); the table is host logic, so it is built
here for an H200's facts and checked over a table of batch shapes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.core import Attn, Batch, Req, Route, RouteKind
from minisgl_worker.engine import EngineConfig
from minisgl_worker.engine.route import Gpu, RouteTable, build_table, min_requests, piece_sizes
from minisgl_worker.models import ModelConfig
from minisgl_worker.protocol import SamplingParams

MODELS = Path(__file__).parents[3] / "benches" / "models"
H200 = Gpu(memory=141 << 30, sms=132)
LLAMA = ModelConfig.from_hf(MODELS / "llama3.1-8b")  # 32 query heads, 8 KV heads
QWEN = ModelConfig.from_hf(MODELS / "qwen3-0.6b")  # 16 query heads, 8 KV heads

D, M, P, E = (RouteKind.DECODE_GRAPH, RouteKind.MIXED_GRAPH, RouteKind.PIECEWISE,
              RouteKind.EAGER)


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
        req = Req(1000 + j, [1] * (n + 5), SamplingParams())
        req.device_len = n
        reqs.append(req)
        extend.append(n)
    zeros = torch.zeros(sum(extend), dtype=torch.long)
    return Batch(reqs=reqs, input_ids=zeros, positions=zeros, out_loc=zeros, extend_lens=extend)


def _table(cfg: ModelConfig = LLAMA, **config: int) -> RouteTable:
    return build_table(EngineConfig("m", **config), cfg, flashinfer=True, fused=True, gpu=H200,
                       max_running=256)


def test_an_h200_table_holds_the_default_graphs() -> None:
    sizes = _table().sizes
    assert sizes.decode == [1, 2, 4, *range(8, 257, 8)]
    assert sizes.whole_kv == list(range(32, 257, 8))
    assert sizes.pieces == [*range(16, 513, 16), 8192]  # and the chunk size
    assert sizes.mixed == piece_sizes(256)
    assert _table().mixed_min_requests == min_requests(132, 8) == 34


@pytest.mark.parametrize(("decodes", "chunks", "route"), [
    # decode steps: the next graph size up; whole KV from 32 when lengths are even
    ([100], [], Route(D, Attn.SPLIT_KV, 1)),
    ([100] * 3, [], Route(D, Attn.SPLIT_KV, 4)),
    ([500] * 20, [], Route(D, Attn.SPLIT_KV, 24)),  # no whole-KV variant below 32
    ([500] * 37, [], Route(D, Attn.WHOLE_KV, 40)),
    ([100] * 36 + [20_000], [], Route(D, Attn.SPLIT_KV, 40)),  # one request > 2x the mean
    ([1000] * 256, [], Route(D, Attn.WHOLE_KV, 256)),
    # prompt chunks alone: piecewise buckets, the chunk size's too, else eager
    ([], [8192], Route(P, Attn.PREFILL, 8192)),
    ([], [500], Route(P, Attn.PREFILL, 512)),
    ([], [600], Route(E, Attn.PREFILL)),  # between 512 and the chunk: no bucket
    ([], [100, 20], Route(P, Attn.PREFILL, 128)),  # few requests: never the mixed graphs
    # mixed steps: whole graphs when FA2's eager plan is the captured one
    ([500] * 34, [100], Route(M, Attn.MIXED_FA2, 144)),  # 35 requests, 134 tokens
    ([500] * 160, [96], Route(M, Attn.MIXED_FA2, 256)),  # the capped step: 256 tokens
    ([100] * 60 + [4000] * 4, [100], Route(M, Attn.MIXED_FA2, 176)),  # uneven: unsplit
    ([500] * 32, [100], Route(P, Attn.MIXED_FA2, 144)),  # 33 requests: FA2 may split
    ([500] * 40, [200], Route(P, Attn.MIXED_FA2, 240)),  # 240 x 4 packed rows > 16 x 41
    ([500] * 200, [100], Route(P, Attn.MIXED_FA2, 304)),  # 300 tokens: past the mixed sizes
    ([500] * 10, [2000], Route(E, Attn.DECODE_THEN_PREFILL)),  # > 1024 prompt rows: FA3
])
def test_llama_8b_on_an_h200_routes(decodes: list[int], chunks: list[int], route: Route) -> None:
    assert _table().route(_batch(decodes, chunks)) == route


def test_qwens_smaller_group_takes_more_steps_whole() -> None:
    batch = _batch([500] * 40, [200])  # 240 x 2 packed rows <= 16 x 41
    assert _table(QWEN).route(batch) == Route(M, Attn.MIXED_FA2, 240)


def test_mha_decodes_on_cuda_cores_without_mixed_or_whole_kv_graphs() -> None:
    mha = dataclasses.replace(LLAMA, num_kv_heads=32)
    table = _table(mha)
    assert table.sizes.mixed == [] and table.sizes.whole_kv == []
    assert table.route(_batch([500] * 64, [])) == Route(D, Attn.SPLIT_KV, 64)
    assert table.route(_batch([500] * 40, [100])) == Route(P, Attn.DECODE_THEN_PREFILL, 144)


def test_flags_remove_graphs_from_the_table() -> None:
    no_decode = _table(cuda_graph_max_bs=0)
    assert no_decode.sizes.decode == [] and no_decode.sizes.pieces
    assert no_decode.route(_batch([100] * 8, [])) == Route(E, Attn.DECODE)
    no_mixed = _table(cuda_graph_mixed_tokens=0)
    assert no_mixed.route(_batch([500] * 34, [100])) == Route(P, Attn.MIXED_FA2, 144)
    unfused = build_table(EngineConfig("m"), LLAMA, flashinfer=True, fused=False, gpu=H200,
                          max_running=256)
    assert unfused.sizes.pieces == unfused.sizes.mixed == [] and unfused.sizes.decode


@pytest.mark.parametrize(("decodes", "chunks"), [([100] * 3, []), ([], [600]), ([9] * 4, [7])])
def test_without_flashinfer_every_batch_runs_eager_torch(decodes: list[int],
                                                         chunks: list[int]) -> None:
    cpu = build_table(EngineConfig("m"), LLAMA, flashinfer=False, fused=False, gpu=None,
                      max_running=32)
    assert not cpu.sizes.any
    assert cpu.route(_batch(decodes, chunks)) == Route(E, Attn.TORCH)


def test_the_cpu_engine_routes_through_its_table(tiny_llama: tuple[Path, torch.nn.Module],
                                                 engine_factory: Any) -> None:
    engine = engine_factory(tiny_llama[0])
    assert set(engine.runners) == {RouteKind.EAGER} and not engine.routes.sizes.any
    for decodes, chunks in ([[5] * 3, []], [[], [9]], [[5], [4]]):
        assert engine.routes.route(_batch(decodes, chunks)) == Route(E, Attn.TORCH)
