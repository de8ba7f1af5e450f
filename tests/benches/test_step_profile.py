"""benches/step_profile.py's split of a batch's tokens: decodes are the rows of requests
with output that extend by one token, as `Batch.phase` counts them; everything else is a
prompt, a one-token chunk and a retracted request's re-prefill included."""

from types import SimpleNamespace

from step_profile import prompt_tokens


def test_prompt_tokens_count_every_row_but_decodes() -> None:
    decoding = SimpleNamespace(is_decoding=True)
    prefilling = SimpleNamespace(is_decoding=False)
    batch = SimpleNamespace(
        reqs=[decoding, decoding, prefilling, decoding, prefilling],
        extend_lens=[1, 1, 1, 5, 7],  # two decodes, a one-token chunk, a re-prefill, a chunk
    )
    assert prompt_tokens(batch) == 1 + 5 + 7  # type: ignore[arg-type]
