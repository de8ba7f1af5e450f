"""The sampler on hand-made logits and real Req objects."""

from __future__ import annotations

import math
from typing import Any

import torch
from minisgl_worker.core import Req
from minisgl_worker.engine import Sampler
from minisgl_worker.protocol import SamplingParams

EOS = 2
V = 32


def _reqs(n: int = 1, prompt: list[int] | None = None, **params: Any) -> list[Req]:
    return [Req(i, prompt or [5, 6], SamplingParams(**params)) for i in range(n)]


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(logits: torch.Tensor, reqs: list[Req]) -> list[int]:
    return Sampler([EOS], torch.device("cpu")).sample(logits.clone(), reqs).tokens.tolist()


def test_greedy_is_argmax_and_plain_greedy_reports_no_logprobs() -> None:
    logits = _logits(4)
    out = Sampler([EOS], torch.device("cpu")).sample(logits.clone(), _reqs(4))
    assert out.tokens.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 4 and out.top_logprobs == [None] * 4


def test_same_seed_same_tokens_and_different_seeds_differ() -> None:
    logits = _logits(1)
    draws = []
    for seed in (7, 7, 8):
        reqs = _reqs(1, temperature=5.0, seed=seed)  # 20 draws from one request's generator
        draws.append([_sample(logits, reqs)[0] for _ in range(20)])
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_seeded_request_is_independent_of_batch_neighbours() -> None:
    logits = _logits(3)
    alone = _sample(logits[1:2], _reqs(1, temperature=2.0, seed=42))
    reqs = [*_reqs(1, temperature=1.0), *_reqs(1, temperature=2.0, seed=42), *_reqs(1)]
    assert _sample(logits, reqs)[1] == alone[0]


def test_top_k_1_and_tiny_top_p_are_greedy() -> None:
    logits = _logits(6, seed=3)
    greedy = logits.argmax(-1).tolist()
    assert _sample(logits, _reqs(6, temperature=1.5, top_k=1)) == greedy
    assert _sample(logits, _reqs(6, temperature=1.5, top_p=1e-6)) == greedy
    assert _sample(logits, _reqs(6, temperature=1.5, min_p=0.999)) == greedy


def test_top_k_restricts_to_the_k_best() -> None:
    logits = _logits(1, seed=4)
    best3 = set(logits[0].topk(3).indices.tolist())
    reqs = _reqs(1, temperature=10.0, top_k=3, seed=1)
    assert {_sample(logits, reqs)[0] for _ in range(50)} <= best3


def test_min_new_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.zeros(1, V)
    logits[0, EOS], logits[0, 9], logits[0, 4] = 10.0, 9.0, 8.0
    assert _sample(logits, _reqs(1, min_new_tokens=1, stop_token_ids=[9])) == [4]
    assert _sample(logits, _reqs(1, min_new_tokens=1, ignore_eos=True)) == [EOS]
    done = _reqs(1, min_new_tokens=1, stop_token_ids=[9])
    done[0].output_ids = [3]
    assert _sample(logits, done) == [EOS]


def test_penalties_follow_their_definitions() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5] + [0.0] * (V - 4)])
    req = _reqs(1, prompt=[2], frequency_penalty=0.5, presence_penalty=0.25,
                repetition_penalty=2.0)[0]
    req.output_ids = [1, 1, 3]
    row = logits[0].clone()
    Sampler([EOS], torch.device("cpu"))._apply_penalties(row, req)
    # token 1: 2 - 0.5*2 - 0.25 = 0.75, then /2; token 3: 0.5 - 0.5 - 0.25 = -0.25, then *2;
    # token 2 (prompt only): -1 * 2; token 0 untouched.
    assert row[:4].tolist() == [1.0, 0.375, -2.0, -0.5]


def test_repetition_penalty_can_change_the_greedy_choice() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 7] = 3.0, 2.0
    assert _sample(logits, _reqs(1, prompt=[5])) == [5]
    assert _sample(logits, _reqs(1, prompt=[5], repetition_penalty=2.0)) == [7]


def test_logprobs_are_log_softmax_of_the_processed_logits() -> None:
    logits = _logits(2, seed=5)
    reqs = [*_reqs(1, logprobs=True, top_logprobs=3),
            *_reqs(1, logprobs=True, temperature=0.5, seed=3)]
    out = Sampler([EOS], torch.device("cpu")).sample(logits.clone(), reqs)
    lp0 = torch.log_softmax(logits[0], -1)
    token0 = int(out.tokens[0])
    assert token0 == int(logits[0].argmax())
    lp_sampled = out.logprobs[0]
    assert lp_sampled is not None and math.isclose(lp_sampled, float(lp0[token0]), abs_tol=1e-5)
    top = out.top_logprobs[0]
    assert top is not None and [t for t, _ in top] == lp0.topk(3).indices.tolist()
    assert top[0][0] == token0
    lp1 = torch.log_softmax(logits[1] / 0.5, -1)  # temperature applied
    lp_sampled = out.logprobs[1]
    assert lp_sampled is not None
    assert math.isclose(lp_sampled, float(lp1[int(out.tokens[1])]), abs_tol=1e-5)
    assert out.top_logprobs[1] is None


def test_logit_bias_forces_and_bans_tokens() -> None:
    logits = _logits(2)
    best = logits.argmax(-1).tolist()
    forced = _reqs(1, logit_bias=[(9, 100.0)])
    banned = _reqs(1, logit_bias=[(best[1], -100.0)])
    assert _sample(logits[:1], forced) == [9]
    assert _sample(logits[1:], banned) != [best[1]]
