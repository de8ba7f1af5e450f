"""The engine's CUDA path (bf16, FlashInfer attention, fused layers, CUDA graphs, GPU
sampler) on small real-shaped random models of each family, against transformers (float32,
same weights) and against our own torch-native GPU path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from minisgl_worker.engine import Engine, EngineConfig
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

from ..worker.conftest import LLAMA3_ROPE, Driver, hf_logits, open_mixed_gate, save_tiny_model

pytestmark = pytest.mark.gpu
# head_dim 64 or 128 only (the FlashInfer modules the JIT cache holds); GQA groups of 2 and
# 4 (4: tensor-core decode).
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rope_scaling": LLAMA3_ROPE},
    "qwen2": {"hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1},
    "qwen3": {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 128},
    "mistral": {"hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                "tie_word_embeddings": False, "sliding_window": None},
}
# initializer_range 0.02 (the families' own): with the conftest's 0.2, two random layers are
# chaotic enough that bf16 rounding alone moves the logits by 3-7% (seen on the H200).
COMMON = {"vocab_size": 512, "intermediate_size": 512, "max_position_embeddings": 512,
          "initializer_range": 0.02}
SEQ = [(37 * i + 11) % 509 + 3 for i in range(64)]
PROMPTS = [[(7 * i + 13 * j) % 500 + 3 for i in range(5 + 11 * j)] for j in range(5)]
SMALL = {"device": "cuda", "kv_tokens": 4096, "max_running": 16}


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    arch = request.param
    path = tmp_path_factory.mktemp(f"gpu-{arch}")
    return arch, path, save_tiny_model(path, arch, **COMMON, **ARCHS[arch])


def _greedy(path: Path, n: int = 32, prompts: list[list[int]] = PROMPTS,
            **options: Any) -> list[list[int]]:
    llm = LLM(path, **{**SMALL, **options})
    try:
        sp = SamplingParams(max_new_tokens=n, ignore_eos=True)
        return [r["token_ids"] for r in llm.generate(prompts, sp)]
    finally:
        llm.shutdown()


def _teacher_forced(path: Path, seqs: list[list[int]], **options: Any) -> list[torch.Tensor]:
    """Every position's float32 logits of each sequence, one prefill each (plus chunked
    for the first: a prefix, two decodes, the rest)."""
    many = len(seqs) > 8  # one request slot per sequence, none freed
    engine = Engine(EngineConfig(str(path), device="cuda", page_size=16,
                                 kv_tokens=16384 if many else 4096,
                                 max_running=len(seqs) if many else 8, **options))
    try:
        assert engine.dtype == torch.bfloat16
        driver = Driver(engine)
        out = []
        for seq in seqs:
            req = driver.new_req(seq)
            lens = [24, 1, 1, len(seq) - 26] if seq is SEQ else [len(seq)]
            out.append(torch.cat([driver.extend([req], [n])[0] for n in lens]).float().cpu())
        return out
    finally:
        engine.shutdown()


def test_bf16_logits_match_transformers(model: Any) -> None:
    """Teacher-forced over 64 positions, FlashInfer + fused layers (and torch-native, for
    scale) in bf16 against transformers in float32 on the same weights."""
    arch, path, ref = model
    exact = hf_logits(ref, SEQ)
    errors = {}
    for backend in ("flashinfer", "torch"):
        ours = _teacher_forced(path, [SEQ], attention_backend=backend)[0]
        errors[backend] = float((ours - exact).norm() / exact.norm())
    print(f"{arch}: bf16 logits vs transformers float32, relative error: FlashInfer "
          f"{errors['flashinfer']:.2e}, torch-native {errors['torch']:.2e}")
    assert errors["flashinfer"] < 2e-2, errors


def test_flashinfer_greedy_equals_torch_native(model: Any) -> None:
    """32 greedy tokens per prompt on the FlashInfer path (CUDA graphs, fused layers). bf16
    paths that round differently can part at a near-tie and then differ completely, so each
    chosen token is checked against the torch-native path teacher-forced on the same text:
    it must be that path's argmax, up to a near-tie (5% of the logits' spread)."""
    arch, path, _ = model
    fused = _greedy(path)
    native = _greedy(path, attention_backend="torch")
    same = sum(a == b for a, b in zip(fused, native))
    print(f"{arch}: {same}/{len(PROMPTS)} prompts give the same 32 greedy tokens")
    ties = _near_ties_vs_torch_native(path, PROMPTS, fused)
    print(f"{arch}: {ties} of {32 * len(PROMPTS)} greedy tokens were near-ties")


def _near_ties_vs_torch_native(path: Path, prompts: list[list[int]],
                               outputs: list[list[int]], **options: Any) -> int:
    """Asserts every generated token is the torch-native path's argmax given the same text
    (teacher-forced; `options`: more EngineConfig fields), up to a near-tie (5% of the
    logits' spread) -> how many were ties."""
    logits = _teacher_forced(path, [p + g for p, g in zip(prompts, outputs)],
                             attention_backend="torch", **options)
    ties = 0
    for prompt, tokens, rows in zip(prompts, outputs, logits):
        rows = rows[len(prompt) - 1 : -1]  # the logits that chose each token
        chosen = rows.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        best = rows.max(-1).values
        assert (chosen >= best - 0.05 * rows.std(-1)).all(), (best - chosen).max()
        ties += int((chosen < best).sum())
    return ties


def test_cuda_graph_replay_equals_eager(model: Any) -> None:
    """Greedy tokens through the decode graphs and eagerly are equal, but for a near-tie
    that the graphs' split-KV sums (another order in bf16) turn: where the two part, each
    must still be the torch-native path's choice up to a near-tie."""
    arch, path, _ = model
    graphs, eager = _greedy(path), _greedy(path, cuda_graph_max_bs=0)
    same = sum(g == e for g, e in zip(graphs, eager))
    if same < len(PROMPTS):
        ties = [_near_ties_vs_torch_native(path, PROMPTS, out) for out in (graphs, eager)]
        print(f"{arch}: {len(PROMPTS) - same} of {len(PROMPTS)} prompts part; near-ties "
              f"(graphs, eager): {ties}")


def test_whole_kv_graphs_at_large_even_batches(model: Any, monkeypatch: Any) -> None:
    """72 requests of similar lengths decode through the graphs without split-KV (checked:
    the backend chose them), and each token is the torch-native path's choice."""
    from minisgl_worker.core import Attn, RouteKind
    from minisgl_worker.engine.route import RouteTable

    arch, path, _ = model
    chosen: list[bool] = []  # per decode-graph replay: split KV?
    route = RouteTable.route

    def spy(self: RouteTable, batch: Any) -> Any:
        r = route(self, batch)
        if r.kind is RouteKind.DECODE_GRAPH:
            chosen.append(r.attn is Attn.SPLIT_KV)
        return r

    monkeypatch.setattr(RouteTable, "route", spy)
    prompts = [[(5 * i + 3 * j) % 500 + 3 for i in range(40 + j % 7)] for j in range(72)]
    out = _greedy(path, 8, prompts, max_running=128, kv_tokens=16384)
    assert chosen.count(False) >= 5, chosen  # 7 decode steps at batch 72 (graph size 72)
    ties = _near_ties_vs_torch_native(path, prompts, out)
    print(f"{arch}: whole-KV graphs on {chosen.count(False)} of {len(chosen)} replays, "
          f"{ties} of {8 * len(prompts)} tokens were near-ties")


def test_gpu_sampler_seeds_and_filters(model: Any) -> None:
    path = model[1]
    llm = LLM(path, **SMALL)
    try:
        seeded = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=50, top_p=0.9,
                                min_p=0.05, seed=5, ignore_eos=True)
        runs = []
        for neighbour_temp in (1.0, 0.7):  # neighbours draw differently each time
            mixed = [SamplingParams(max_new_tokens=16, temperature=neighbour_temp,
                                    ignore_eos=True)] * 4
            runs.append(llm.generate(PROMPTS, [seeded, *mixed]))
        assert runs[0][0]["token_ids"] == runs[1][0]["token_ids"]  # the seed fixes it
        assert runs[0][1]["token_ids"] != runs[1][1]["token_ids"]
        top1 = SamplingParams(max_new_tokens=16, temperature=1.5, top_k=1, ignore_eos=True)
        greedy = SamplingParams(max_new_tokens=16, ignore_eos=True)
        assert llm.generate(PROMPTS, top1) == llm.generate(PROMPTS, greedy)
    finally:
        llm.shutdown()


def _mixed_batch(driver: Driver, lens: list[int]) -> Any:
    """Requests already holding 40, 33 and 7 (+ 0) tokens, extending by `lens`, decodes
    first as the scheduler orders them -> (the Batch, its logits rows)."""
    from minisgl_worker.core import Batch

    held = [40, 33, 7, 0][: len(lens)]
    reqs = [driver.new_req([(13 * i + 7 * j) % 500 + 3 for i in range(h + n)])
            for j, (h, n) in enumerate(zip(held, lens))]
    for req, h in zip(reqs, held):
        if h:
            driver.extend([req], [h])
    for req, n in zip(reqs, lens):
        req.device_len = req.cached_len + n
        if n == 1:
            req.output_ids = [req.input_ids.pop()]  # a decode: its newest token is an output
    locs = [driver.cache.extend(r, r.device_len) for r in reqs]
    driver.cache.flush_table()
    dev = driver.engine.device
    ids = [t for r in reqs for t in r.all_ids[r.cached_len : r.device_len]]
    pos = [p for r in reqs for p in range(r.cached_len, r.device_len)]
    batch = Batch(reqs=reqs, input_ids=torch.tensor(ids, device=dev),
                  positions=torch.tensor(pos, device=dev),
                  out_loc=torch.from_numpy(np.concatenate(locs)).to(dev),
                  extend_lens=list(lens), sample_reqs=reqs)
    rows = torch.tensor(batch.last_token_indices, device=dev)
    return batch, rows


def _eager_logits(engine: Engine, batch: Any, rows: torch.Tensor) -> torch.Tensor:
    engine.attn_backend.prepare(batch, engine.routes.eager(batch))
    with engine.ctx.forward_batch(batch):
        return engine.model(batch.input_ids, batch.positions, rows).float()


def _assert_close(label: str, graphed: torch.Tensor, eager: torch.Tensor) -> None:
    """Same logits up to bf16 rounding, and no NaN (a row the replay did not write)."""
    assert not graphed.isnan().any()
    err = float((graphed - eager).norm() / eager.norm())
    print(f"{label} vs eager logits, relative error {err:.2e}")
    assert err < 1e-2, err


@pytest.mark.parametrize("lens", [[1, 1, 37, 21], [1, 30, 2], [23, 10, 9], [1, 1, 120, 125]])
def test_piecewise_graphs_equal_the_eager_forward(model: Any, lens: list[int]) -> None:
    """A mixed batch (decodes and prompt chunks; the third case prompt chunks only) of a
    token count between buckets, through the piecewise graphs and eagerly: same logits up to
    bf16 rounding. The last case (247 tokens) replays the bucket at the chunk size (256),
    above the 16-step buckets (to 96). The static q and attention buffers are poisoned
    first, so a row the replay does not write, or a padding row leaking into a real one,
    shows as NaN."""
    from minisgl_worker.core import RouteKind

    engine = Engine(EngineConfig(str(model[1]), device="cuda", page_size=16, kv_tokens=4096,
                                 max_running=8, cuda_graph_max_tokens=96, chunk_size=256))
    try:
        runner = engine.runners[RouteKind.PIECEWISE]
        assert engine.routes.sizes.pieces[-2:] == [96, 256]
        batch, rows = _mixed_batch(Driver(engine), lens)
        route = engine.routes.route(batch)
        assert batch.num_tokens % 16 and route.kind is RouteKind.PIECEWISE
        assert route.size == (256 if batch.num_tokens > 96 else -(-batch.num_tokens // 16) * 16)
        with torch.inference_mode():
            eager = _eager_logits(engine, batch, rows)
            runner.q.fill_(float("nan"))
            runner.attn_out.fill_(float("nan"))
            pieces = runner.run(batch, route).float()
        _assert_close(f"{model[0]} {lens}: piecewise", pieces, eager)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("lens", [[1, 1, 37, 21], [1, 30, 2], [23, 10, 9], [1, 1, 1, 5]])
def test_mixed_graphs_equal_the_eager_forward(model: Any, lens: list[int],
                                              monkeypatch: Any) -> None:
    """A batch of decodes first, then prompt chunks (the third case chunks only), through a
    whole mixed-step graph (attention captured) and eagerly: same logits up to bf16
    rounding, with the padding rows of the graph's size (16 multiples) left out."""
    from minisgl_worker.core import RouteKind
    from minisgl_worker.engine.route import piece_sizes

    open_mixed_gate(monkeypatch)  # the graphs, for a batch of a few requests
    engine = Engine(EngineConfig(str(model[1]), device="cuda", page_size=16, kv_tokens=4096,
                                 max_running=8, cuda_graph_max_tokens=96, chunk_size=256,
                                 cuda_graph_mixed_tokens=256))
    try:
        runner = engine.runners[RouteKind.MIXED_GRAPH]
        assert engine.routes.sizes.mixed == piece_sizes(96)
        batch, rows = _mixed_batch(Driver(engine), lens)
        route = engine.routes.route(batch)
        assert batch.phase != "decode" and route.kind is RouteKind.MIXED_GRAPH
        with torch.inference_mode():
            eager = _eager_logits(engine, batch, rows)
            graphed = runner.run(batch, route).float()
        _assert_close(f"{model[0]} {lens}: mixed graph", graphed, eager)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("graphs", ["piecewise", "mixed"])
def test_generation_through_graphs_with_prompt_tokens(model: Any, monkeypatch: Any,
                                                      graphs: str) -> None:
    """Prompt chunks of 8 tokens beside the decodes: every step with prompt tokens replays
    the piecewise graphs, or with `cuda_graph_mixed_tokens` the whole mixed-step graphs
    (counted), and each greedy token is the torch-native path's choice up to a near-tie."""
    from minisgl_worker.engine.graphs import MixedGraphs, PiecewiseGraphs

    arch, path, _ = model
    cls = MixedGraphs if graphs == "mixed" else PiecewiseGraphs
    runs = []
    run = cls.run

    def spy(self: Any, batch: Any, route: Any) -> Any:
        runs.append(batch.phase)
        return run(self, batch, route)

    monkeypatch.setattr(cls, "run", spy)
    open_mixed_gate(monkeypatch)  # five prompts: at most five requests a step
    mixed_tokens = 64 if graphs == "mixed" else 0
    out = _greedy(path, 24, chunk_size=8, cuda_graph_max_tokens=64,
                  cuda_graph_mixed_tokens=mixed_tokens)
    assert runs.count("mixed") >= 5 and "prefill" in runs, runs
    ties = _near_ties_vs_torch_native(path, PROMPTS, out)
    print(f"{arch}: {len(runs)} {graphs} steps ({runs.count('mixed')} mixed), {ties} of "
          f"{24 * len(PROMPTS)} tokens were near-ties")
