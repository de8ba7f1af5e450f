"""The grammar cache and masks on the default model's real tokenizer (no model run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from minisgl_worker.constrain import (
    GrammarCache,
    GrammarError,
    RequestMatcher,
    apply_bitmask,
    fill_bitmask,
)
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import Constraint, ConstraintKind
from tokenizers import Tokenizer

VOCAB = 49152
EOS = 2


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(ensure_default_model())


@pytest.fixture(scope="module")
def grammars(folder: Path) -> GrammarCache:
    return GrammarCache(folder / "tokenizer.json", VOCAB, [EOS])


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def _allowed(matcher: RequestMatcher) -> set[int]:
    logits = torch.zeros(1, VOCAB)
    apply_bitmask(logits, *fill_bitmask([matcher], VOCAB, pin=False))
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def _walk(matcher: RequestMatcher, ids: list[int]) -> list[bool]:
    """Advances through ids, checking each is in the mask first -> ended after each."""
    ended = []
    for t in ids:
        assert t in _allowed(matcher), t
        ended.append(matcher.advance(t))
    return ended


def test_a_schema_admits_its_instance_and_ends_at_its_close(
    grammars: GrammarCache, tokenizer: Tokenizer
) -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
              "required": ["kind"], "additionalProperties": False}
    matcher = RequestMatcher(grammars.matcher(Constraint(ConstraintKind.JSON_SCHEMA,
                                                         json.dumps(schema))))
    ids = tokenizer.encode('{"kind": "dog"}', add_special_tokens=False).ids
    assert EOS not in _allowed(matcher)
    ended = _walk(matcher, ids)
    assert ended[-1] and not any(ended[:-1])  # the closing brace ends it
    assert matcher.ended  # nothing but EOS could follow: the request finishes here
    assert _allowed(RequestMatcher(matcher.llmatcher.deep_copy())) == set(range(VOCAB))  # no mask


def test_a_choice_ends_without_eos_and_escapes_quotes(
    grammars: GrammarCache, tokenizer: Tokenizer
) -> None:
    choices = ['say "hi"', "no"]
    matcher = RequestMatcher(grammars.matcher(Constraint(ConstraintKind.CHOICE,
                                                         json.dumps(choices))))
    ids = tokenizer.encode('say "hi"', add_special_tokens=False).ids
    assert _walk(matcher, ids)[-1] is True  # nothing can follow: the grammar has ended


def test_advancing_to_a_position_twice_takes_the_token_once(
    grammars: GrammarCache, tokenizer: Tokenizer
) -> None:
    """A constrained step moves the matchers before it processes the rest of the batch,
    which asks again with the same position (scheduler.py): the second call only answers."""
    matcher = RequestMatcher(grammars.matcher(Constraint(ConstraintKind.CHOICE,
                                                         json.dumps(["no", "nope"]))))
    ids = tokenizer.encode("no", add_special_tokens=False).ids
    assert len(ids) == 1
    once = RequestMatcher(matcher.llmatcher.deep_copy())
    assert not matcher.advance(ids[0], 1) and not once.advance(ids[0])  # "nope" may follow
    assert not matcher.advance(ids[0], 1)
    assert matcher.num_tokens == 1 and _allowed(matcher) == _allowed(once)  # taken once
    with pytest.raises(AssertionError):
        matcher.advance(ids[0], 3)  # a position skipped


def test_regex_lark_and_gbnf_compile_and_constrain(grammars: GrammarCache) -> None:
    for kind, source in [(ConstraintKind.REGEX, "[0-9]+"), (ConstraintKind.LARK, 'start: /[0-9]+/'),
                         (ConstraintKind.EBNF, 'root ::= [0-9]+')]:
        allowed = _allowed(RequestMatcher(grammars.matcher(Constraint(kind, source))))
        assert allowed and EOS not in allowed, kind


def test_compiled_grammars_are_cached_per_source(grammars: GrammarCache) -> None:
    constraint = Constraint(ConstraintKind.REGEX, "(ab)+c")
    before = grammars.num_compiled
    first, second = grammars.matcher(constraint), grammars.matcher(constraint)
    assert grammars.num_compiled == before + 1
    assert first is not second  # each request advances its own copy
    RequestMatcher(first).advance(_a_token(first))
    assert _allowed(RequestMatcher(second)) == _allowed(RequestMatcher(grammars.matcher(constraint)))


def test_the_cache_is_bounded_by_count_and_by_source_bytes(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from minisgl_worker.constrain import grammar

    cache = GrammarCache(folder / "tokenizer.json", VOCAB, [EOS])
    monkeypatch.setattr(grammar, "MAX_CACHED", 3)
    monkeypatch.setattr(grammar, "MAX_CACHED_BYTES", 100)
    regex = [Constraint(ConstraintKind.REGEX, f"[a-z]{{{n}}}" + "x" * 30) for n in range(5)]
    for c in regex[:3]:  # 38 bytes each: two fit in 100
        cache.matcher(c)
    assert [c for c in regex if cache.cached(c) is not None] == regex[1:3]
    assert cache.cached_bytes == 76
    cache.matcher(regex[1])  # used again: now the newest
    cache.matcher(regex[3])
    assert [c for c in regex if cache.cached(c) is not None] == [regex[1], regex[3]]
    big = Constraint(ConstraintKind.REGEX, "y" * 150)  # larger than the bound alone: kept
    cache.matcher(big)
    assert cache.cached(big) is not None and cache.cached_bytes == 150
    monkeypatch.setattr(grammar, "MAX_CACHED_BYTES", 10_000)
    for c in regex:
        cache.matcher(c)
    assert [c for c in regex if cache.cached(c) is not None] == regex[2:]  # count: 3


def _a_token(matcher: object) -> int:
    rows, bitmask = fill_bitmask([RequestMatcher(matcher)], VOCAB, pin=False)  # type: ignore[arg-type]
    logits = torch.zeros(1, VOCAB)
    apply_bitmask(logits, rows, bitmask)
    return int(torch.nonzero(logits[0] == 0)[0])


@pytest.mark.parametrize("kind, source, match", [
    (ConstraintKind.JSON_SCHEMA, '{"type": "objekt"}', "objekt"),
    (ConstraintKind.REGEX, "[a-", "unclosed character class"),
    (ConstraintKind.LARK, "start: missing_rule", "missing_rule"),
    (ConstraintKind.EBNF, "root ::= (", "Expected '\\)'"),
    (ConstraintKind.CHOICE, "[]", "non-empty JSON array"),
])
def test_a_bad_source_is_a_grammar_error_naming_it(
    grammars: GrammarCache, kind: ConstraintKind, source: str, match: str
) -> None:
    with pytest.raises(GrammarError, match=match):
        grammars.matcher(Constraint(kind, source))


def test_unconstrained_rows_are_left_alone() -> None:
    logits = torch.randn(2, 70)
    expected = logits.clone()
    rows, bitmask = fill_bitmask([None, None], 70, pin=False)
    assert rows == [] and bitmask.shape == (0, 3)
    apply_bitmask(logits, rows, bitmask)
    assert torch.equal(logits, expected)


def test_a_mixed_batch_masks_its_constrained_rows_only(grammars: GrammarCache) -> None:
    """Rows 1 and 3 constrained (3 by a grammar that has ended: no mask), 0 and 2 free."""
    constraint = Constraint(ConstraintKind.CHOICE, '["yes", "no"]')
    live, done = RequestMatcher(grammars.matcher(constraint)), RequestMatcher(grammars.matcher(constraint))
    while not done.advance(_a_token(done.llmatcher)):
        pass
    logits = torch.randn(4, VOCAB)
    expected = logits.clone()
    rows, bitmask = fill_bitmask([None, live, None, done], VOCAB, pin=False)
    assert rows == [1]
    apply_bitmask(logits, rows, bitmask)
    assert torch.equal(logits[[0, 2, 3]], expected[[0, 2, 3]])
    assert set(torch.nonzero(logits[1] == expected[1]).flatten().tolist()) == _allowed(live)
    assert 0 < len(_allowed(live)) < VOCAB
