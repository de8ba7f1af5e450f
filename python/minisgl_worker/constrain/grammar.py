"""Constraints compiled into llguidance grammars, once per distinct (kind, source).

The engine is llguidance (PyPI `llguidance`), not XGrammar. Both install here from PyPI and
run on CPU with our torch; on the default model's tokenizer (49152 tokens) and a nested
JSON schema, llguidance built its tokenizer in 0.34 s, compiled the schema in 1.4 ms and
computed a mask in 0.11 ms a token; XGrammar compiled in 7.6 ms and masked in 0.01 ms a
token. We take llguidance because it fits the worker better:
- it builds its tokenizer from the model's tokenizer.json alone, whereas XGrammar imports
  `transformers` (and apache-tvm-ffi) at import time, and the worker's runtime never does;
- it compiles lazily (no ahead-of-time pass over the vocabulary per grammar), so a new
  schema costs its first request milliseconds, not a compile step; its 0.1 ms per token is
  far below a decode step, and masks are filled on the host whatever the engine;
- one engine reads every kind we accept: JSON Schema, regexes (Rust `regex` syntax, which
  the router checks with the same grammar of patterns), Lark grammars natively, and GBNF
  through its own converter.

A compiled grammar is an `LLMatcher` in its start state; each request gets a `deep_copy`,
which shares the compiled grammar and the tokenizer. The cache keeps the most recently used
grammars, at most `MAX_CACHED` of them and `MAX_CACHED_BYTES` of their sources together:
a compiled grammar holds tens of times its source (a 600 KB schema 28 MiB here), and the
router takes bodies of up to 4 MiB, so a count alone would let distinct large schemas
grow the worker by gigabytes.

A serving worker compiles a grammar it has not cached on a helper thread (`compile_later`;
llguidance releases the GIL while it compiles): milliseconds for a typical schema, but
0.7 s for a 600 KB one here, which the scheduler loop would otherwise spend with every
other request's decoding stopped. vLLM and SGLang compile off their loops too.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llguidance as llg
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..protocol import Constraint, ConstraintKind

logger = logging.getLogger(__name__)

MAX_CACHED = 256
MAX_CACHED_BYTES = 8 << 20  # of sources; the newest grammar stays whatever its size
# Compact JSON: ", " and ": " between items, no other whitespace. Flexible whitespace would
# let a sampled output spend its tokens on blank lines.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
}


class GrammarError(ValueError):
    """A constraint that does not compile; the message says why."""


class GrammarCache:
    """Compiles constraints for one tokenizer and hands out matchers in their start state."""

    def __init__(self, tokenizer_path: Path, vocab_size: int, eos_token_ids: list[int]) -> None:
        """tokenizer_path: the model's tokenizer.json. vocab_size: the logits' width (may
        exceed the tokenizer's: padded LM heads)."""
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: llg.LLTokenizer | None = None  # built at the first constraint
        self._grammars: OrderedDict[tuple[ConstraintKind, str], llg.LLMatcher] = OrderedDict()
        self._cached_bytes = 0  # the sources' of the cached grammars
        self._compiling: dict[tuple[ConstraintKind, str], Future[llg.LLMatcher]] = {}
        self._pool: ThreadPoolExecutor | None = None  # started by the first compile_later
        self.compile_seconds = 0.0  # total, for benchmarks
        self.num_compiled = 0

    @property
    def tokenizer(self) -> llg.LLTokenizer:
        if self._tokenizer is None:
            if not self.tokenizer_path.is_file():
                raise GrammarError(
                    f"constraints need the model's tokenizer.json; {self.tokenizer_path} "
                    "does not exist")
            start = time.perf_counter()
            self._tokenizer = llg.LLTokenizer(
                self.tokenizer_path.read_text(), n_vocab=self.vocab_size,
                eos_token=self.eos_token_ids)
            logger.info("grammar tokenizer built in %.2f s", time.perf_counter() - start)
        return self._tokenizer

    def matcher(self, constraint: Constraint) -> llg.LLMatcher:
        """A fresh matcher for the constraint, compiled now if it is not cached; raises
        GrammarError if it does not compile."""
        cached = self.cached(constraint)
        if cached is not None:
            return cached
        compiled = self._compile(constraint)
        self._store(constraint, compiled)
        return compiled.deep_copy()

    def cached(self, constraint: Constraint) -> llg.LLMatcher | None:
        """A fresh matcher for the constraint if its grammar is compiled, else None."""
        key = (constraint.kind, constraint.source)
        compiled = self._grammars.get(key)
        if compiled is None:
            return None
        self._grammars.move_to_end(key)
        return compiled.deep_copy()

    def compile_later(self, constraint: Constraint) -> Future[llg.LLMatcher]:
        """The constraint's grammar compiling on the helper thread (one compile per distinct
        grammar at a time); hand the finished future to `matcher_from`."""
        key = (constraint.kind, constraint.source)
        future = self._compiling.get(key)
        if future is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
            future = self._compiling[key] = self._pool.submit(self._compile, constraint)
        return future

    def matcher_from(self, constraint: Constraint, future: Future[llg.LLMatcher]
                     ) -> llg.LLMatcher:
        """A fresh matcher from `compile_later`'s future, waiting for it if it runs; the
        grammar is cached from now on. Raises GrammarError if it does not compile."""
        self._compiling.pop((constraint.kind, constraint.source), None)
        compiled = future.result()
        self._store(constraint, compiled)
        return compiled.deep_copy()

    def forget(self, constraint: Constraint, future: Future[llg.LLMatcher]) -> None:
        """No request waits for `compile_later`'s future any more (they were aborted): drop
        it, cancelled if it has not started, so that its grammar is not held outside the
        cache's bounds."""
        key = (constraint.kind, constraint.source)
        if self._compiling.get(key) is future:
            del self._compiling[key]
            future.cancel()

    @property
    def num_compiling(self) -> int:
        """Compiles started by `compile_later` and not yet handed to `matcher_from`."""
        return len(self._compiling)

    def shutdown(self) -> None:
        """Stops the compile thread (after the compile it runs, if any)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def _store(self, constraint: Constraint, compiled: llg.LLMatcher) -> None:
        key = (constraint.kind, constraint.source)
        if self._grammars.pop(key, None) is not None:
            self._cached_bytes -= len(constraint.source)
        self._grammars[key] = compiled
        self._cached_bytes += len(constraint.source)
        while len(self._grammars) > 1 and (
                len(self._grammars) > MAX_CACHED or self._cached_bytes > MAX_CACHED_BYTES):
            (_, source), _ = self._grammars.popitem(last=False)
            self._cached_bytes -= len(source)

    def _compile(self, constraint: Constraint) -> llg.LLMatcher:
        start = time.perf_counter()
        grammar = to_llguidance(constraint)
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{constraint.kind.value} constraint: {matcher.get_error()}")
        self.compile_seconds += time.perf_counter() - start
        self.num_compiled += 1
        return matcher


def to_llguidance(constraint: Constraint) -> str:
    """The constraint as an llguidance grammar (not yet checked: LLMatcher does that)."""
    kind, source = constraint.kind, constraint.source
    try:
        if kind is ConstraintKind.JSON_SCHEMA:
            return llg.LLMatcher.grammar_from_json_schema(
                source, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        if kind is ConstraintKind.REGEX:
            return llg.LLMatcher.grammar_from_regex(source)
        if kind is ConstraintKind.LARK:
            return llg.LLMatcher.grammar_from_lark(source)
        if kind is ConstraintKind.EBNF:
            return llg.LLMatcher.grammar_from_lark(gbnf_to_lark(source))
        assert kind is ConstraintKind.CHOICE, kind
        return llg.LLMatcher.grammar_from_lark(_choice_to_lark(source))
    except GrammarError:
        raise
    except Exception as e:  # the converters raise ValueError and their own types
        raise GrammarError(f"{kind.value} constraint: {e}") from e


def _choice_to_lark(source: str) -> str:
    """A JSON array of strings -> `start: "a" | "b"` (Lark string literals take JSON's
    escapes, so json.dumps quotes each choice)."""
    choices = json.loads(source)
    if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
        raise GrammarError("choice constraint: the source must be a non-empty JSON array of "
                           f"strings; got {source!r:.100}")
    return "start: " + " | ".join(json.dumps(c) for c in choices)
