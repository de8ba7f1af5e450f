"""The offline API at tp 2 (this process is rank 0; rank 1 is spawned, gloo on CPU) against
transformers: greedy tokens match with KV heads split and with one KV head replicated
(and a vocabulary tp does not divide); sampled tokens' logprobs match the reference given
those very tokens, which holds only while both ranks feed the same tokens back (a rank
that sampled its own token would put another token's embedding into the shared sum)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import Constraint, ConstraintKind, SamplingParams

from .conftest import save_byte_tokenizer, save_tiny_model
from .distributed.tp_group import run_group

PROMPTS = [[5, 6, 7, 8, 9], [100, 3], [(7 * i) % 250 + 3 for i in range(40)]]


def _reference_logprobs(ref: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = ref(ids).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def _generate(folder: Path, prompts: list[list[int]], params: Any,
              on_batch: Callable[[Any], None] | None = None, **options: Any) -> list[list[int]]:
    """The tokens an LLM on `folder` (CPU, 1,024 KV tokens, page 2, `options`) generates;
    `on_batch` sees each batch rank 0 runs, before its forward."""
    llm = LLM(folder, device="cpu", kv_tokens=1024, page_size=2, **options)
    if on_batch is not None:
        forward = llm.engine.forward_batch

        def recorded(batch: Any, *args: Any) -> Any:
            on_batch(batch)
            return forward(batch, *args)

        llm.engine.forward_batch = recorded  # type: ignore[method-assign]
    try:
        return [r["token_ids"] for r in llm.generate(prompts, params)]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kv_heads,vocab", [(2, 256), (1, 255)], ids=["split", "replicated"])
def test_tp2_matches_transformers(tmp_path: Path, kv_heads: int, vocab: int) -> None:
    ref = save_tiny_model(tmp_path, num_key_value_heads=kv_heads, vocab_size=vocab)
    llm = LLM(tmp_path, tp=2, device="cpu", kv_tokens=1024, page_size=2)
    try:
        greedy = llm.generate(PROMPTS, SamplingParams(max_new_tokens=12, ignore_eos=True))
        llm.drop_prefix_cache()  # on every rank: a rank that kept its cache would run apart
        sampled = llm.generate(PROMPTS, SamplingParams(
            temperature=1.0, max_new_tokens=12, ignore_eos=True, logprobs=True))
    finally:
        llm.shutdown()
    for prompt, res in zip(PROMPTS, greedy):
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                               do_sample=False)
        assert res["token_ids"] == out[0, len(prompt):].tolist()
    for prompt, res in zip(PROMPTS, sampled):
        assert res["cached_tokens"] == 0
        want = _reference_logprobs(ref, prompt, res["token_ids"])
        torch.testing.assert_close(res["logprobs"], want, atol=1e-3, rtol=1e-3)


def test_tp2_grammar_rows_under_overlap_keep_the_ranks_together(tmp_path: Path) -> None:
    """Constrained and unconstrained requests at tp 2 with overlap scheduling forced on:
    every rank runs the same batches (the grammar row in every step, beside unconstrained
    decodes and alone, its sampling waiting for its newest token: scheduler.py) and fills
    the same masks, so the group ends and answers what one rank without overlap does:
    the grammar's letters only, the free requests' greedy tokens."""
    save_tiny_model(tmp_path)
    save_byte_tokenizer(tmp_path)
    letters = Constraint(ConstraintKind.REGEX, "[a-z]{20,30}")  # byte tokens: 20 at least
    params = [SamplingParams(max_new_tokens=8, ignore_eos=True),
              SamplingParams(max_new_tokens=16, constraint=letters),
              SamplingParams(max_new_tokens=4, ignore_eos=True)]
    batches: list[set[int]] = []  # rank 0's, as the sets of rids that sample
    tp2 = _generate(tmp_path, PROMPTS, params, lambda b: batches.append(
        {r.rid for r in b.sample_reqs}), tp=2, overlap=True)
    assert tp2 == _generate(tmp_path, PROMPTS, params, tp=1, overlap=False)
    steps = [i for i, b in enumerate(batches) if 1 in b]  # rid 1's 16 tokens: every step
    assert steps == list(range(steps[0], steps[0] + 16)), batches
    assert {0, 1} in batches and {1} in batches, batches  # beside the others, then alone
    assert len(tp2[1]) == 16 and all(ord("a") <= t <= ord("z") for t in tp2[1])


def test_tp2_spf_orders_every_rank_s_queue_alike(tmp_path: Path) -> None:
    """spf orders the queue by arrival time and prompt length; the arrival is rank 0's
    (llm.py, scheduler/loop.py), so with one request slot both ranks admit the same
    request at each step, shortest prompt first, and answer what one rank does."""
    save_tiny_model(tmp_path)
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]  # 40, 5 and 2 tokens
    admitted: list[int] = []  # rank 0's rids in the order of their first step
    tp2 = _generate(tmp_path, prompts, params, lambda b: admitted.extend(
        r.rid for r in b.reqs if r.rid not in admitted), tp=2, policy="spf", max_running=1)
    assert admitted == [2, 1, 0]
    assert tp2 == _generate(tmp_path, prompts, params, tp=1, policy="spf", max_running=1)


def _rank_settings(folder: str) -> None:
    """Each rank asks for its own settings (as hosts started by hand may); every rank's
    scheduler must run rank 0's, or their batches and collectives would part."""
    from minisgl_worker.distributed import get_tp_info
    from minisgl_worker.engine import Engine, EngineConfig
    from minisgl_worker.scheduler import Scheduler

    rank = get_tp_info().rank
    engine = Engine(EngineConfig(model_path=folder, device="cpu", dtype="float32",
                                 kv_tokens=256, page_size=2))
    try:
        sched = Scheduler(engine, chunk_size=64, overlap=rank == 1,
                          policy=["fcfs", "lof"][rank], mixed_chunk_size=[16, 32][rank])
        budget = sched.budget
        assert (budget.policy, budget.mixed_chunk_size, sched.overlap) == ("fcfs", 16, False)
    finally:
        engine.shutdown()


def test_tp2_every_rank_schedules_with_rank_0_s_settings(tmp_path: Path) -> None:
    save_tiny_model(tmp_path)
    run_group(2, _rank_settings, str(tmp_path))


def test_tp2_a_kv_cache_too_large_for_memory_is_one_line_per_rank_not_a_traceback(
        tmp_path: Path) -> None:
    """Every rank checks --kv-tokens against its share of host memory, and they agree before
    raising, so no rank waits in a collective for one that failed; the spawned rank says
    its error in one line and exits 2, rank 0's main() says its own."""
    save_tiny_model(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "minisgl_worker", "--model", str(tmp_path), "--device", "cpu",
         "--tp", "2", "--kv-tokens", str(10**15), "--listen", f"ipc://{tmp_path}/w.sock"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert ("minisgl_worker: error: --kv-tokens 1,000,000,000,000,000 needs "
            in done.stderr), done.stderr[-3000:]
    assert "shared by 2 rank(s)" in done.stderr, done.stderr[-3000:]
