"""Masks filled ahead on the helper thread (constrain/prefetch.py) against masks filled on
the spot, on the default model's tokenizer (no model run): the same bits, for live grammars
only, ready rows reused only where their matcher has not moved, the others filled."""

from __future__ import annotations

import json
from pathlib import Path

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
    whole = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        '{"city": "Rome", "note": "rain"}', add_special_tokens=False).ids
    ended = _req(8, grammars, whole)  # the object is closed: the grammar is over
    assert ended.matcher.ended  # type: ignore[union-attr]
    ahead = MaskPrefetch(torch.device("cpu"), VOCAB)
    try:
        assert ahead.start([r.matcher for r in (reqs[0], free, reqs[1], ended, reqs[2])])
        ready = ahead.join()
        assert ready is not None and ahead.join() is None  # joined once
        assert not ahead.start([free.matcher]) and ahead.join() is None
    finally:
        ahead.shutdown()
    matchers = [r.matcher for r in reqs]
    assert ready.rows == {m: (j, m.num_tokens) for j, m in enumerate(matchers)}  # type: ignore[misc]
    assert torch.equal(ready.bitmask, _spot(matchers))  # type: ignore[arg-type]
    assert [m.num_tokens for m in matchers] == [2, 5, 9]  # type: ignore[union-attr]  # unmoved


def test_the_sampler_reuses_ready_rows_and_fills_the_rest(grammars: GrammarCache) -> None:
    reqs = [_req(rid, grammars, []) for rid in range(3)]
    ahead = MaskPrefetch(torch.device("cpu"), VOCAB)
    try:
        for req in reqs[:2]:
            req.matcher.advance(OPEN)  # type: ignore[union-attr]
        assert ahead.start([r.matcher for r in reqs[:2]])
        ready = ahead.join()
        assert ready is not None
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
