"""The golden protocol vectors: the messages below, encoded by `protocol.encode_frame`.

Run `python tests/data/protocol/golden.py` to rewrite the .msgpack files after a protocol
change (and bump the version). Both the pytest suite and `cargo test` decode these files
and re-encode the same messages byte for byte.
"""

from pathlib import Path

from minisgl_worker.kvcache.blocks import chain_hashes
from minisgl_worker.protocol import (
    Abort,
    CacheEvents,
    Constraint,
    ConstraintKind,
    Error,
    ErrorCode,
    Generate,
    Hello,
    Load,
    Ready,
    SamplingParams,
    Shutdown,
    Step,
    TokenOutput,
    encode_frame,
)

# Two pages of 4 tokens: cache_events' block hashes are checked against this prefix.
BLOCK_TOKENS = [1, 2, 300, 70000, 5, 6, 7, 8]

FRAMES = {
    "router_frame": [
        Generate(
            rid=7,
            input_ids=[1, 2, 300, 70000],
            sampling=SamplingParams(
                temperature=0.7,
                top_p=0.9,
                top_k=50,
                min_p=0.05,
                seed=1234,
                max_new_tokens=32,
                min_new_tokens=2,
                ignore_eos=False,
                stop_token_ids=[2, 49152],
                frequency_penalty=0.5,
                presence_penalty=-0.5,
                repetition_penalty=1.1,
                logprobs=True,
                top_logprobs=3,
                logit_bias=[(42, 5.0), (7, -100.0)],
                constraint=Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}'),
            ),
        ),
        Generate(rid=2**40, input_ids=[5], sampling=SamplingParams()),
        Generate(
            rid=8,
            input_ids=[5],
            sampling=SamplingParams(constraint=Constraint(ConstraintKind.CHOICE, '["yes", "no"]')),
        ),
        Abort(rid=7),
        Shutdown(),
        Hello(),
    ],
    "worker_frame": [
        Ready(
            model="SmolLM2-135M-Instruct",
            vocab_size=49152,
            max_context=8192,
            kv_capacity=123456,
            eos_token_ids=[2],
            page_size=1,
            tp_size=1,
            device="cpu",
        ),
        Step(
            outputs=[
                TokenOutput(rid=7, token=42, logprob=-0.25, top_logprobs=[(42, -0.25), (17, -1.5)]),
                TokenOutput(rid=8, token=2, finish="stop", cached_tokens=16),
                TokenOutput(rid=2**40, token=70000, finish="length"),
            ]
        ),
        Error(
            rid=9,
            code=ErrorCode.CONTEXT_TOO_LONG,
            message="prompt has 9000 tokens; the context is 8192",
        ),
        Error(rid=10, code=ErrorCode.INVALID_REQUEST, message="input_ids is empty"),
        Error(
            rid=12,
            code=ErrorCode.INVALID_CONSTRAINT,
            message='json_schema constraint: Unimplemented keys: ["not"]',
        ),
        Error(rid=11, code=ErrorCode.INTERNAL, message="worker step failed"),
        Error(rid=None, code=ErrorCode.BAD_MESSAGE, message="frame version must be 1; got 2"),
        Load(
            waiting=3,
            running=64,
            kv_used=1000,
            kv_cached=500,
            kv_total=123456,
            prompt_tokens=4096,
            cached_prompt_tokens=1024,
        ),
        # Both sides' tests also compute these hashes from BLOCK_TOKENS themselves.
        CacheEvents(
            stored=chain_hashes(0, BLOCK_TOKENS, 4),
            removed=chain_hashes(0, BLOCK_TOKENS[:4] + [70000, 0, 1, 2**32 - 1], 4)[1:],
        ),
    ],
}


def main() -> None:
    here = Path(__file__).parent
    for name, msgs in FRAMES.items():
        (here / f"{name}.msgpack").write_bytes(encode_frame(msgs))  # type: ignore[arg-type]
        print(f"wrote {name}.msgpack")


if __name__ == "__main__":
    main()
