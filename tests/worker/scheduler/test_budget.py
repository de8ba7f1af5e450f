"""StepBudget: how many prompt tokens a step takes beside its decodes, and the defaults
derived from the model and the GPU (the 8B and 0.6B shapes of benches/models)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
from minisgl_worker.core import Req
from minisgl_worker.models import ModelConfig
from minisgl_worker.protocol import SamplingParams
from minisgl_worker.scheduler.budget import (
    GPU_PEAKS,
    PREFILL_EFFICIENCY,
    ROUND,
    SPF_WINDOW,
    TARGET_ITL_S,
    GpuPeak,
    StepBudget,
    derive,
    linear_params,
)


def test_without_decodes_a_step_takes_the_whole_chunk() -> None:
    assert StepBudget(8192, mixed_chunk_size=192, mixed_step_tokens=256).prompt_tokens(0) == 8192


def test_the_chunk_counts_decodes_and_mixed_chunk_caps_prompts_beside_them() -> None:
    assert StepBudget(100).prompt_tokens(30) == 70
    assert StepBudget(100, mixed_chunk_size=50).prompt_tokens(30) == 50
    assert StepBudget(100).prompt_tokens(100) == 1  # prompts always advance


def test_mixed_step_tokens_caps_the_step_from_a_quarter_as_many_decodes() -> None:
    b = StepBudget(8192, mixed_step_tokens=256)
    assert [b.prompt_tokens(n) for n in (1, 63)] == [8191, 8129]  # fewer than 256 // 4
    assert [b.prompt_tokens(n) for n in (64, 100, 200)] == [192, 156, 56]  # steps of 256
    assert [b.prompt_tokens(n) for n in (224, 250, 400)] == [32, 32, 32]  # at least 256 // 8
    assert StepBudget(8192, mixed_chunk_size=40, mixed_step_tokens=256).prompt_tokens(100) == 40


def test_bad_settings_are_errors_that_name_them() -> None:
    with pytest.raises(ValueError, match="mixed_step_tokens must be 0 .off. or at least 4; got 3"):
        StepBudget(8192, mixed_step_tokens=3)
    with pytest.raises(ValueError, match="policy must be one of"):
        StepBudget(8192, policy="sjf")


def queued(rid: int, prompt_tokens: int, arrival: float) -> Req:
    req = Req(rid, [1] * prompt_tokens, SamplingParams())
    req.arrival = arrival
    return req


def test_spf_puts_short_prompts_first_unless_they_come_after_the_window() -> None:
    b = StepBudget(8192, "spf", prompt_token_s=1e-3)  # a window of 32 ms a prompt token
    waiting: deque[Req] = deque()
    for req in (queued(0, 30, 0.0), queued(1, 10, 0.0), queued(2, 20, 0.001)):
        b.enqueue(waiting, req)
    assert [r.rid for r in waiting] == [1, 2, 0]  # keys 0.32, 0.641, 0.96
    b.enqueue(waiting, queued(3, 1, 0.97))  # after rid 0's window (0.96): behind it
    b.enqueue(waiting, queued(4, 1, 0.5))  # within rids 2's and 0's: ahead of them
    assert [r.rid for r in waiting] == [1, 4, 2, 0, 3]
    b.enqueue(waiting, queued(5, 10, 0.0))  # rid 1's key: after it, first come first
    assert [r.rid for r in waiting] == [1, 5, 4, 2, 0, 3]


def test_spf_needs_a_token_estimate() -> None:
    with pytest.raises(AssertionError, match="spf needs prompt_token_s"):
        StepBudget(8192, "spf")


H200 = GpuPeak("NVIDIA H200", *GPU_PEAKS["H200"])
MODELS = Path(__file__).parents[3] / "benches" / "models"


def shape(name: str) -> ModelConfig:
    return ModelConfig.from_hf(MODELS / name)


def test_serving_the_8b_shape_on_an_h200_bounds_prompts_beside_decodes() -> None:
    d = derive(shape("llama3.1-8b"), H200, 8192, offline=False)
    assert (d.policy, d.mixed_chunk_size, d.mixed_step_tokens) == ("spf", 2048, 0)
    # Its prompt work fits the target at the GPU's prefill rate; one more tile would not.
    rate = H200.flops * PREFILL_EFFICIENCY / (2 * linear_params(shape("llama3.1-8b")))
    assert d.prompt_token_s == pytest.approx(1 / rate)
    assert SPF_WINDOW * 1024 * d.prompt_token_s == pytest.approx(0.77, abs=0.01)  # docstring
    assert d.mixed_chunk_size / rate <= TARGET_ITL_S < (d.mixed_chunk_size + ROUND) / rate
    b = StepBudget.resolve(8192, None, None, None, d)
    assert [b.prompt_tokens(n) for n in (0, 1, 254)] == [8192, 2048, 2048]  # none: whole chunk
    assert "2125 prompt tokens fit 50 ms, 2048 beside decodes; spf" in d.why


def test_the_small_shape_keeps_the_whole_chunk() -> None:
    for offline, policy in ((False, "spf"), (True, "fcfs")):  # 34k tokens fit 50 ms; its
        d = derive(shape("qwen3-0.6b"), H200, 8192, offline)  # decode is launch-bound
        assert (d.policy, d.mixed_chunk_size, d.mixed_step_tokens) == (policy, 8192, 0)


def test_a_batch_job_on_the_8b_shape_takes_lof_and_ridge_sized_steps() -> None:
    d = derive(shape("llama3.1-8b"), H200, 8192, offline=True)
    assert (d.policy, d.mixed_chunk_size, d.mixed_step_tokens) == ("lof", 8192, 256)
    assert linear_params(shape("llama3.1-8b")) == 6_979_321_856  # Llama-3.1-8B's layers
    weak = GpuPeak("few FLOPs", 200e12, 4.8e12)  # ridge 42: the smallest step, 64
    assert derive(shape("llama3.1-8b"), weak, 8192, offline=True).mixed_step_tokens == 64
    fast = GpuPeak("fast HBM", 989e12, 8.0e12)  # weights read in 1.9 ms: launch-bound
    assert derive(shape("llama3.1-8b"), fast, 8192, offline=True).policy == "fcfs"


def test_on_cpu_nothing_is_bounded() -> None:
    d = derive(shape("llama3.1-8b"), None, 8192, offline=False)
    assert (d.policy, d.mixed_chunk_size, d.mixed_step_tokens) == ("fcfs", 8192, 0)
    b = StepBudget.resolve(8192, "spf", None, None, d)  # asked for: a CPU's token estimate
    assert b.prompt_token_s == d.prompt_token_s > 0


def test_settings_given_override_what_is_derived() -> None:
    d = derive(shape("llama3.1-8b"), H200, 8192, offline=True)
    b = StepBudget.resolve(8192, "fcfs", 1024, 0, d)
    assert (b.policy, b.mixed_chunk_size, b.mixed_step_tokens) == ("fcfs", 1024, 0)
    b = StepBudget.resolve(4096, None, 0, None, derive(shape("llama3.1-8b"), H200, 4096, False))
    assert (b.policy, b.mixed_chunk_size, b.prompt_tokens(10)) == ("spf", 4096, 4086)
    assert derive(shape("llama3.1-8b"), H200, 1024, offline=False).mixed_chunk_size == 1024
