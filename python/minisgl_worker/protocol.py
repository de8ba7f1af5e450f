"""The router <-> worker protocol, version 6 (docs/protocol.md is the specification).

Messages are dataclasses; a frame is `{"v": 6, "msgs": [...]}` encoded with msgpack. Field
order in each dataclass is the wire order: `encode_frame` emits maps in that order so the
bytes match the Rust side (tests/data/protocol/ holds the golden vectors both sides check).
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar

import msgpack

VERSION = 6


class ProtocolError(ValueError):
    """A frame that does not follow docs/protocol.md."""


class ConstraintKind(str, Enum):
    """What a constraint's `source` holds (docs/protocol.md, "constraint")."""

    JSON_SCHEMA = "json_schema"  # a JSON Schema, as JSON text
    REGEX = "regex"  # a regular expression (Rust regex syntax) the whole output matches
    LARK = "lark"  # a Lark grammar (llguidance's dialect)
    EBNF = "ebnf"  # a GBNF grammar (llama.cpp / XGrammar style, `root ::= ...`)
    CHOICE = "choice"  # a JSON array of strings: the output is exactly one of them


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output must match; decoding is masked so that it does."""

    kind: ConstraintKind
    source: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: bool = False
    top_logprobs: int = 0
    # (token, bias) pairs added to the logits before temperature; bias in [-100, 100]
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    constraint: Constraint | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


# ---- router -> worker ----


@dataclass(frozen=True, slots=True)
class Generate:
    TYPE: ClassVar[str] = "generate"
    rid: int
    input_ids: list[int]
    sampling: SamplingParams


@dataclass(frozen=True, slots=True)
class Abort:
    TYPE: ClassVar[str] = "abort"
    rid: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    TYPE: ClassVar[str] = "shutdown"


@dataclass(frozen=True, slots=True)
class Hello:
    """The router's first message on every connection; the worker answers with Ready."""

    TYPE: ClassVar[str] = "hello"


# ---- worker -> router ----


@dataclass(frozen=True, slots=True)
class Ready:
    TYPE: ClassVar[str] = "ready"
    model: str
    vocab_size: int
    max_context: int
    kv_capacity: int
    eos_token_ids: list[int]
    page_size: int
    tp_size: int
    device: str


@dataclass(frozen=True, slots=True)
class TokenOutput:
    rid: int
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish: str | None = None  # None, "stop" or "length"
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    TYPE: ClassVar[str] = "step"
    outputs: list[TokenOutput]


class ErrorCode(str, Enum):
    """Why the worker refused or failed something: the router acts on this, never on the
    message."""

    INVALID_REQUEST = "invalid_request"  # cannot be served as given (no ids, bad token id)
    INVALID_CONSTRAINT = "invalid_constraint"  # its constraint does not compile
    CONTEXT_TOO_LONG = "context_too_long"  # the prompt does not fit this worker's context
    BAD_MESSAGE = "bad_message"  # a frame or message that does not follow the protocol
    INTERNAL = "internal"  # the worker failed while serving it


@dataclass(frozen=True, slots=True)
class Error:
    TYPE: ClassVar[str] = "error"
    rid: int | None
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Load:
    TYPE: ClassVar[str] = "load"
    waiting: int
    running: int
    kv_used: int
    kv_cached: int
    kv_total: int
    prompt_tokens: int = 0  # cumulative: prompt tokens of every request started
    cached_prompt_tokens: int = 0  # cumulative: of those, how many came from the prefix cache


@dataclass(frozen=True, slots=True)
class CacheEvents:
    """The prefix cache's net change since the worker's previous CacheEvents: block hashes
    (kvcache/blocks.py) stored and removed. After Ready, `stored` lists every block."""

    TYPE: ClassVar[str] = "cache_events"
    stored: list[int]
    removed: list[int]


RouterMsg = Generate | Abort | Shutdown | Hello
WorkerMsg = Ready | Step | Error | Load | CacheEvents
Msg = RouterMsg | WorkerMsg

_BY_TYPE: dict[str, type] = {
    cls.TYPE: cls
    for cls in (Generate, Abort, Shutdown, Hello, Ready, Step, Error, Load, CacheEvents)
}


def _to_wire(msg: Msg) -> dict[str, Any]:
    out: dict[str, Any] = {"type": msg.TYPE}
    for f in fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, SamplingParams):
            value = {g.name: getattr(value, g.name) for g in fields(value)}
            value["logit_bias"] = [[t, float(b)] for t, b in value["logit_bias"]]
            c = value["constraint"]
            value["constraint"] = None if c is None else {"kind": c.kind.value, "source": c.source}
        elif f.name == "outputs":
            value = [_output_to_wire(o) for o in value]
        elif isinstance(value, ErrorCode):
            value = value.value
        out[f.name] = value
    return out


def _output_to_wire(o: TokenOutput) -> dict[str, Any]:
    top = None if o.top_logprobs is None else [[t, float(lp)] for t, lp in o.top_logprobs]
    logprob = None if o.logprob is None else float(o.logprob)
    return {
        "rid": o.rid,
        "token": o.token,
        "logprob": logprob,
        "top_logprobs": top,
        "finish": o.finish,
        "cached_tokens": o.cached_tokens,
    }


def _from_wire(raw: Any) -> Msg:
    # reprlib.repr describes bad values: repr() of a deeply nested frame exhausts the stack.
    if not isinstance(raw, dict) or "type" not in raw:
        raise ProtocolError(f"message must be a map with a 'type'; got {reprlib.repr(raw)}")
    cls = _BY_TYPE.get(raw["type"])
    if cls is None:
        raise ProtocolError(f"unknown message type {reprlib.repr(raw['type'])}")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in raw]
    if missing:
        raise ProtocolError(f"{raw['type']}: missing fields {missing}")
    kwargs = {n: raw[n] for n in names}
    try:
        if cls is Generate:
            kwargs["sampling"] = _sampling_from_wire(kwargs["sampling"])
        if cls is Step:
            kwargs["outputs"] = [_output_from_wire(o) for o in kwargs["outputs"]]
        if cls is Error:
            kwargs["code"] = ErrorCode(kwargs["code"])
        return cls(**kwargs)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"{raw['type']}: {e}") from e


def _sampling_from_wire(raw: Any) -> SamplingParams:
    names = [f.name for f in fields(SamplingParams)]
    if not isinstance(raw, dict) or sorted(raw) != sorted(names):
        keys = sorted(raw) if isinstance(raw, dict) else raw
        raise ProtocolError(
            f"sampling must be a map with exactly the keys {names}; got {reprlib.repr(keys)}"
        )
    bias = raw["logit_bias"]
    if not (isinstance(bias, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and is_int(p[0]) and is_number(p[1])
            for p in bias)):
        raise ProtocolError(f"sampling.logit_bias must be [[token, bias], ...]; got "
                            f"{reprlib.repr(bias)}")
    bias = [(t, float(b)) for t, b in bias]
    return SamplingParams(**{**raw, "logit_bias": bias,
                             "constraint": _constraint_from_wire(raw["constraint"])})


def is_int(value: Any) -> bool:
    """An integer on the wire, not a boolean (Python's bools are ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, float) or is_int(value)


def _constraint_from_wire(raw: Any) -> Constraint | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or list(raw) != ["kind", "source"]:
        raise ProtocolError(
            f"sampling.constraint must be nil or {{kind, source}}; got {reprlib.repr(raw)}")
    if not isinstance(raw["source"], str):
        raise ProtocolError("sampling.constraint.source must be a string")
    try:
        return Constraint(ConstraintKind(raw["kind"]), raw["source"])
    except ValueError as e:
        raise ProtocolError(f"sampling.constraint.kind: {e}") from e


def _output_from_wire(raw: Any) -> TokenOutput:
    if not isinstance(raw, dict):
        raise ProtocolError(f"step output must be a map; got {reprlib.repr(raw)}")
    top = raw.get("top_logprobs")
    if top is not None:
        raw = {**raw, "top_logprobs": [(t, lp) for t, lp in top]}
    return TokenOutput(**raw)


def encode_frame(msgs: list[Msg]) -> bytes:
    """One frame: every message of one tick, in order."""
    return msgpack.packb({"v": VERSION, "msgs": [_to_wire(m) for m in msgs]}, use_bin_type=True)


def decode_frame(data: bytes) -> list[Msg]:
    try:
        raw = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolError(f"frame is not msgpack: {e}") from e
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        version = raw.get("v") if isinstance(raw, dict) else None
        raise ProtocolError(f"frame version must be {VERSION}; got {reprlib.repr(version)}")
    msgs = raw.get("msgs")
    if not isinstance(msgs, list):
        raise ProtocolError("frame has no 'msgs' list")
    return [_from_wire(m) for m in msgs]
