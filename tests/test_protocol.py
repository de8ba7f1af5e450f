"""The Python side of the protocol against the golden vectors (cargo test checks the same files)."""

import importlib.util
import re
from pathlib import Path

import msgpack
import pytest
from minisgl_worker.protocol import (
    VERSION,
    Abort,
    Error,
    ErrorCode,
    Generate,
    ProtocolError,
    SamplingParams,
    decode_frame,
    encode_frame,
)

GOLDEN_DIR = Path(__file__).parent / "data" / "protocol"


def _golden_frames() -> dict[str, list]:
    spec = importlib.util.spec_from_file_location("golden", GOLDEN_DIR / "golden.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FRAMES


@pytest.mark.parametrize("name", ["router_frame", "worker_frame"])
def test_golden_vectors_decode_and_reencode_byte_for_byte(name: str) -> None:
    data = (GOLDEN_DIR / f"{name}.msgpack").read_bytes()
    expected = _golden_frames()[name]
    assert decode_frame(data) == expected
    assert encode_frame(expected) == data


def test_wire_keys_follow_the_documented_order() -> None:
    raw = msgpack.unpackb(encode_frame([Generate(rid=1, input_ids=[3], sampling=SamplingParams())]))
    assert list(raw) == ["v", "msgs"]
    msg = raw["msgs"][0]
    assert list(msg) == ["type", "rid", "input_ids", "sampling"]
    assert list(msg["sampling"])[:3] == ["temperature", "top_p", "top_k"]


def test_wrong_version_is_rejected() -> None:
    data = msgpack.packb({"v": VERSION + 1, "msgs": []})
    with pytest.raises(ProtocolError, match=f"version must be {VERSION}; got {VERSION + 1}"):
        decode_frame(data)


def test_error_codes_are_the_documented_enum() -> None:
    wire = msgpack.unpackb(encode_frame([Error(4, ErrorCode.CONTEXT_TOO_LONG, "m")]))
    assert wire["msgs"][0] == {"type": "error", "rid": 4, "code": "context_too_long", "message": "m"}
    decoded = decode_frame(encode_frame([Error(None, ErrorCode.INTERNAL, "m")]))
    assert decoded[0].code is ErrorCode.INTERNAL
    bad = {"type": "error", "rid": 4, "code": "too_long", "message": "m"}
    with pytest.raises(ProtocolError, match="'too_long' is not a valid ErrorCode"):
        decode_frame(msgpack.packb({"v": VERSION, "msgs": [bad]}))


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"v": VERSION, "msgs": [{"type": "launch_missiles"}]}, "unknown message type"),
        ({"v": VERSION, "msgs": [{"type": "abort"}]}, "missing fields"),
        ({"v": VERSION, "msgs": "abort"}, "no 'msgs' list"),
        ({"v": VERSION, "msgs": [[1, 2]]}, "must be a map"),
    ],
)
def test_malformed_frames_name_the_problem(raw: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_frame(msgpack.packb(raw))


def test_garbage_bytes_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not msgpack"):
        decode_frame(b"\xc1\xc1\xc1")


def test_roundtrip_preserves_batches_in_order() -> None:
    msgs = [Abort(rid=i) for i in range(100)]
    assert decode_frame(encode_frame(msgs)) == msgs


def _generate_with_sampling(sampling: object) -> bytes:
    msg = {"type": "generate", "rid": 1, "input_ids": [1], "sampling": sampling}
    return msgpack.packb({"v": VERSION, "msgs": [msg]})


def test_sampling_must_carry_every_documented_key() -> None:
    partial = {"temperature": 0.5}
    with pytest.raises(ProtocolError, match="exactly the keys"):
        decode_frame(_generate_with_sampling(partial))


def test_sampling_with_an_unknown_key_is_a_protocol_error() -> None:
    wire = msgpack.unpackb(
        encode_frame([Generate(rid=1, input_ids=[1], sampling=SamplingParams())])
    )
    sampling = {**wire["msgs"][0]["sampling"], "beam_width": 4}
    with pytest.raises(ProtocolError, match="exactly the keys"):
        decode_frame(_generate_with_sampling(sampling))


def test_non_map_sampling_and_outputs_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        decode_frame(_generate_with_sampling([0.5]))
    step = {"type": "step", "outputs": ["token"]}
    with pytest.raises(ProtocolError, match="step output must be a map"):
        decode_frame(msgpack.packb({"v": VERSION, "msgs": [step]}))


@pytest.mark.parametrize("constraint, match", [
    ({"kind": "xml", "source": "<a/>"}, "'xml' is not a valid ConstraintKind"),
    ({"kind": "regex"}, "nil or {kind, source}"),
    ({"kind": "regex", "source": 5}, "source must be a string"),
    ("a+", "nil or {kind, source}"),
])
def test_a_malformed_constraint_is_a_protocol_error(constraint: object, match: str) -> None:
    wire = msgpack.unpackb(
        encode_frame([Generate(rid=1, input_ids=[1], sampling=SamplingParams())])
    )
    sampling = {**wire["msgs"][0]["sampling"], "constraint": constraint}
    with pytest.raises(ProtocolError, match=re.escape(match)):
        decode_frame(_generate_with_sampling(sampling))


def test_a_deeply_nested_frame_is_a_protocol_error_not_a_recursion_error() -> None:
    # 1,000 levels of lists where a message should be: describing it must not recurse.
    frame = b"\x82\xa1v" + msgpack.packb(VERSION) + b"\xa4msgs\x91" + b"\x91" * 1000 + b"\x00"
    with pytest.raises(ProtocolError, match=re.escape("must be a map with a 'type'; got [[[[[")):
        decode_frame(frame)


@pytest.mark.parametrize("bias", [[[5.5, 1.0]], [["5", 1.0]], [[5, "1"]], [[True, 1.0]], [[5]],
                                  {"5": 1.0}])
def test_logit_bias_must_be_token_and_number_pairs(bias: object) -> None:
    wire = msgpack.unpackb(
        encode_frame([Generate(rid=1, input_ids=[1], sampling=SamplingParams())])
    )
    sampling = {**wire["msgs"][0]["sampling"], "logit_bias": bias}
    with pytest.raises(ProtocolError, match=re.escape("sampling.logit_bias must be [[token, "
                                                      "bias], ...]")):
        decode_frame(_generate_with_sampling(sampling))
