"""Masks filled ahead on the helper thread (constrain/prefetch.py) against masks filled on
the spot, on the default model's tokenizer (no model run): the same bits, each token taken
once, ready rows reused only where their matcher has not moved, the others filled."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from minisgl_worker.constrain import GrammarCache, MaskFiller, MaskPrefetch, RequestMatcher
from minisgl_worker.core import Req, ReqStatus
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import Constraint, ConstraintKind, SamplingParams
from tokenizers import Tokenizer

VOCAB = 49152
OPEN, CITY = 39428, 20721  # `{"` and `city` in the default model's tokenizer
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                           "note": {"type": "string"}},
          "required": ["city", "note"]}


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(ensure_default_model())


@pytest.fixture(scope="module")
def grammars(folder: Path) -> GrammarCache:
    return GrammarCache(folder / "tokenizer.json", VOCAB, [2])


def _req(rid: int, grammars: GrammarCache, text_so_far: list[int]) -> Req:
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    req = Req(rid, [1, 2, 3], SamplingParams(constraint=constraint))
    req.matcher = RequestMatcher(grammars.matcher(constraint))
    for token in text_so_far:
        req.matcher.advance(token)
    req.status = ReqStatus.RUNNING
    return req


def _spot(matchers: list[RequestMatcher | None]) -> torch.Tensor:
    return MaskFiller(pin=False).fill(matchers, VOCAB)[1]


def test_prefetched_masks_are_the_masks_filled_on_the_spot(grammars: GrammarCache,
                                                           folder: Path) -> None:
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        '{"city": "Paris", "note": "sunny', add_special_tokens=False).ids
    reqs = [_req(rid, grammars, ids[:k]) for rid, k in enumerate([2, 5, 9])]
    free = Req(9, [1], SamplingParams())  # unconstrained: no row
    finished = _req(8, grammars, ids[:3])
    finished.status = ReqStatus.FINISHED  # ended while in flight: its token is dropped
    batch = SimpleNamespace(sample_reqs=[reqs[0], free, reqs[1], finished, reqs[2]])
    sampled = [ids[2], 0, ids[5], 12345, ids[9]]  # each request's next token
    out = SimpleNamespace(tokens=lambda: sampled)
    ahead = MaskPrefetch(torch.device("cpu"), VOCAB)
    try:
        ready = ahead.start(batch, out).result()  # type: ignore[arg-type, union-attr]
    finally:
        ahead.shutdown()
    assert [r.matcher.num_tokens for r in reqs] == [3, 6, 10]  # type: ignore[union-attr]
    assert finished.matcher.num_tokens == 3  # type: ignore[union-attr]
    matchers = [r.matcher for r in reqs]
    assert torch.equal(ready.bitmask, _spot(matchers))  # type: ignore[arg-type]
    # The scheduler then processes the same tokens: taken already, not again.
    for req, token, position in zip(reqs, [ids[2], ids[5], ids[9]], [3, 6, 10]):
        assert req.matcher.take(position, token) is False  # type: ignore[union-attr]
    assert [r.matcher.num_tokens for r in reqs] == [3, 6, 10]  # type: ignore[union-attr]
    with pytest.raises(AssertionError):
        reqs[0].matcher.take(3, ids[3])  # type: ignore[union-attr]  # not the token it took


def test_the_sampler_reuses_ready_rows_and_fills_the_rest(grammars: GrammarCache) -> None:
    reqs = [_req(rid, grammars, []) for rid in range(3)]
    ahead = MaskPrefetch(torch.device("cpu"), VOCAB)
    try:
        batch = SimpleNamespace(sample_reqs=reqs[:2])
        ready = ahead.start(batch, SimpleNamespace(tokens=lambda: [OPEN, OPEN])).result()  # type: ignore[arg-type, union-attr]
        assert ahead.start(SimpleNamespace(sample_reqs=[Req(5, [1], SamplingParams())]),
                           SimpleNamespace(tokens=lambda: [7])) is None  # type: ignore[arg-type]
    finally:
        ahead.shutdown()
    filler = MaskFiller(pin=False)
    in_order = [r.matcher for r in reqs[:2]]
    rows, bitmask = filler.fill(in_order, VOCAB, ready)  # type: ignore[arg-type]
    assert rows == [0, 1] and bitmask is ready.bitmask  # nothing to do
    # Another order, a request new to decoding (no ready row) and an unconstrained row.
    mixed = [reqs[2].matcher, None, reqs[1].matcher, reqs[0].matcher]
    rows, bitmask = filler.fill(mixed, VOCAB, ready)
    assert rows == [0, 2, 3] and torch.equal(bitmask, _spot(mixed))
    reqs[0].matcher.advance(CITY)  # type: ignore[union-attr]  # moved on: its ready row is stale
    rows, bitmask = filler.fill(in_order, VOCAB, ready)  # type: ignore[arg-type]
    assert torch.equal(bitmask, _spot(in_order))  # type: ignore[arg-type]
    assert not torch.equal(bitmask[0], ready.bitmask[0])
