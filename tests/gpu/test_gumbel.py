"""The one-pass Triton sampler (engine/gumbel.py) and the Sampler's use of it on CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from minisgl_worker.core import Req
from minisgl_worker.engine import Sampler
from minisgl_worker.engine.gumbel import gumbel_sample
from minisgl_worker.protocol import SamplingParams

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _seeds(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.long, device=DEV) * 7919 + 13


@pytest.mark.parametrize("vocab", [37, 5000])  # one block; several blocks with a ragged end
def test_draws_follow_softmax_of_logits_over_temperature(vocab: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(0)
    row = torch.randn(vocab, device=DEV, generator=gen) * 2
    row[:5] += 6  # a few likely tokens, so the frequencies are measurable
    n, temp = 200_000, 0.7
    tokens = gumbel_sample(row.expand(n, vocab),  # stride 0: one row, read n times
                           torch.full((n,), temp, device=DEV), _seeds(n))
    freq = torch.bincount(tokens, minlength=vocab).double() / n
    p = torch.softmax(row.double() / temp, -1)
    # 5 standard deviations of a frequency estimate, per token
    bound = 5 * (p * (1 - p) / n).sqrt() + 1e-4
    assert ((freq - p).abs() <= bound).all(), (freq - p).abs().max()


def test_temperature_zero_rows_are_argmax_and_masked_tokens_never_win() -> None:
    logits = torch.randn(64, 151_936, device=DEV)
    logits[:, -1] = 50.0  # the last token of a ragged last block
    logits[::2, -1] = float("-inf")  # even rows: banned
    temps = torch.tensor([0.0, 1.0] * 32, device=DEV)
    tokens = gumbel_sample(logits, temps, _seeds(64))
    assert tokens[::2].tolist() == logits[::2].argmax(-1).tolist()
    assert (tokens[1::2] == 151_935).all()
    assert (tokens[::2] != 151_935).all()


def test_same_seed_same_draw_and_bf16_rows() -> None:
    logits = torch.randn(32, 4096, device=DEV, dtype=torch.bfloat16)
    temps = torch.full((32,), 1.0, device=DEV)
    a, b = (gumbel_sample(logits, temps, _seeds(32)) for _ in range(2))
    c = gumbel_sample(logits, temps, _seeds(32, start=1000))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def _req(rid: int, **params: Any) -> Req:
    return Req(rid, [5, 6], SamplingParams(**params))


def test_sampler_seeded_draw_does_not_depend_on_the_neighbours_path() -> None:
    """A seeded plain request: alone (the all-plain fast path), next to a top-k request
    (split draw) and next to a logprobs request (processed logits, temperature applied
    first) draws the same token."""
    sampler = Sampler([2], DEV)
    logits = torch.randn(2, 151_936, device=DEV) * 3
    seeded = _req(0, temperature=0.9, seed=1234)
    draws = set()
    for other in ({"temperature": 1.0}, {"temperature": 1.0, "top_k": 20},
                  {"temperature": 1.0, "logprobs": True}):
        out = sampler.sample(logits.clone(), [seeded, _req(1, **other)])
        draws.add(out.tokens[0].item())
    alone = sampler.sample(logits[:1].clone(), [seeded]).tokens[0].item()
    assert draws == {alone}
    seeded.output_ids.append(alone)  # the next token of the same request: a new key
    nxt = [sampler.sample(logits[:1].clone(), [seeded]).tokens[0].item() for _ in range(2)]
    assert nxt[0] == nxt[1]


def test_sampler_draws_the_same_from_bf16_logits_as_from_their_float32_copy() -> None:
    """The model hands the sampler bf16 logits; each path (greedy argmax, the fused draw,
    the processed float32 path) draws what it would from the exact float32 upcast."""
    sampler = Sampler([2], DEV)
    logits = (torch.randn(3, 128_256, device=DEV) * 3).to(torch.bfloat16)
    for params in ({"temperature": 0.0}, {"temperature": 0.7, "seed": 7},
                   {"temperature": 0.7, "seed": 7, "logprobs": True},
                   {"temperature": 0.7, "seed": 7, "top_k": 50}):
        low = sampler.sample(logits.clone(), [_req(i, **params) for i in range(3)]).tokens
        high = sampler.sample(logits.float(), [_req(i, **params) for i in range(3)]).tokens
        assert torch.equal(low, high), params
    untouched = logits.clone()
    sampler.sample(logits, [_req(0, temperature=0.5, logprobs=True)] * 3)
    assert torch.equal(logits, untouched)  # edits go to the float32 copy


def test_draw_does_not_depend_on_how_many_programs_split_the_row() -> None:
    logits = torch.randn(1024, 151_936, device=DEV)
    temps = torch.full((1024,), 0.8, device=DEV)
    seeds = _seeds(1024)
    batched = gumbel_sample(logits, temps, seeds)  # one program per row
    alone = [gumbel_sample(logits[i : i + 1], temps[i : i + 1], seeds[i : i + 1]).item()
             for i in range(0, 1024, 97)]  # each row over ~75 programs
    assert batched[::97].tolist() == alone


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """(R, V) bools -> (R, ceil(V / 32)) int32 words, bit t % 32 of word t // 32 (mask.py)."""
    rows, vocab = allowed.shape
    words = -(-vocab // 32)
    bits = torch.zeros(rows, words * 32, dtype=torch.int64, device=allowed.device)
    bits[:, :vocab] = allowed.long()
    packed = (bits.view(rows, words, 32) << torch.arange(32, device=allowed.device)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_a_bitmask_row_draws_as_its_masked_logits_would_and_leaves_other_rows_be() -> None:
    """The mask applied in the pass: a constrained row draws exactly what the float32
    path's -inf-masked logits draw (so only allowed tokens), greedy rows included, and a
    row without a mask draws as it would with no bitmask at all."""
    vocab = 151_936
    gen = torch.Generator(device=DEV).manual_seed(1)
    logits = (torch.randn(8, vocab, device=DEV, generator=gen) * 3).to(torch.bfloat16)
    allowed = torch.rand(3, vocab, device=DEV, generator=gen) < 0.01
    allowed[:, -1] = True  # a bit of the ragged last word
    mask_rows = torch.tensor([2, -1, 0, -1, 1, -1, -1, 0], device=DEV)
    temps = torch.tensor([1.0, 1.0, 0.7, 0.0, 1.0, 0.5, 1.0, 0.0], device=DEV)
    seeds = _seeds(8)
    tokens = gumbel_sample(logits, temps, seeds, _pack(allowed), mask_rows)
    masked = logits.float()
    for i, r in enumerate(mask_rows.tolist()):
        if r >= 0:
            masked[i, ~allowed[r]] = float("-inf")
    assert tokens.tolist() == gumbel_sample(masked, temps, seeds).tolist()
    for i, r in enumerate(mask_rows.tolist()):
        if r >= 0:
            assert allowed[r, tokens[i]], (i, tokens[i])
    free = gumbel_sample(logits, temps, seeds)
    assert tokens[mask_rows < 0].tolist() == free[mask_rows < 0].tolist()
    only_last = torch.zeros(1, vocab, dtype=torch.bool, device=DEV)
    only_last[0, -1] = True  # bit 31 of its word: int32's sign bit
    one = gumbel_sample(logits[:1], temps[:1], seeds[:1], _pack(only_last),
                        torch.zeros(1, dtype=torch.long, device=DEV))
    assert one.item() == vocab - 1
