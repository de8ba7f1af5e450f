"""StepBudget: how many prompt tokens a step takes beside its decodes."""

from __future__ import annotations

import pytest
from minisgl_worker.scheduler.budget import StepBudget


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
    with pytest.raises(ValueError, match="mixed_step_tokens must be at least 4; got 3"):
        StepBudget(8192, mixed_step_tokens=3)
    with pytest.raises(ValueError, match="policy must be one of"):
        StepBudget(8192, policy="sjf")
