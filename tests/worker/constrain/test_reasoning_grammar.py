"""The router's reasoning-aware grammars (router/src/api/tools/think.rs, whose Rust test pins
the same text) on the worker's grammar cache and the default model's tokenizer: the model may
think until the first `</think>` (qwen3: optionally; deepseek-r1: it starts inside the
thought), then the constraint holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from minisgl_worker.constrain import GrammarCache
from minisgl_worker.default_model import ensure_default_model
from minisgl_worker.protocol import Constraint, ConstraintKind
from tokenizers import Tokenizer

ANSWER = ('answer: %json {"type":"object","x-guidance":{"whitespace_flexible":false,'
          '"item_separator":", ","key_separator":": "}}\n')
QWEN3 = ('%llguidance {}\nstart: ("<think>" thought /[ \\n]*/)? answer\n'
         'thought[lazy]: THOUGHT "</think>"\nTHOUGHT: /(.|\\n)*/\n' + ANSWER)
DEEPSEEK_R1 = QWEN3.replace('("<think>" thought /[ \\n]*/)?', '"<think>"? thought /[ \\n]*/')


@pytest.fixture(scope="module")
def parts() -> tuple[GrammarCache, Tokenizer]:
    folder = Path(ensure_default_model())
    return (GrammarCache(folder / "tokenizer.json", 49152, [2]),
            Tokenizer.from_file(str(folder / "tokenizer.json")))


@pytest.mark.parametrize("grammar, text, accepted", [
    (QWEN3, '<think>\nA {"a": 1} </think>\n\n{"a": 2}', True),
    (QWEN3, '{"a": 3}', True),
    (QWEN3, '\n{"a": 3}', False),  # no thought: the answer starts at once
    (QWEN3, '<think>x</think>oops', False),
    (DEEPSEEK_R1, 'x {"a": 1}</think>{"a": 4}', True),
    (DEEPSEEK_R1, '{"a": 3}', False),  # still thinking: no answer yet
])
def test_the_answer_follows_the_thought(parts: tuple[GrammarCache, Tokenizer], grammar: str,
                                        text: str, accepted: bool) -> None:
    grammars, tokenizer = parts
    matcher = grammars.matcher(Constraint(ConstraintKind.LARK, grammar))
    consumed = all(matcher.consume_token(t)
                   for t in tokenizer.encode(text, add_special_tokens=False).ids)
    assert (consumed and matcher.is_accepting()) == accepted, text
