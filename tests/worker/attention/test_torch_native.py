"""Paged attention: any split of a sequence into prefill chunks and decode steps, alone or
batched with other requests, gives the logits of one full prefill (and of transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ..conftest import Driver, hf_logits

TOL = 1e-4
SEQ = [(11 * i + 5) % 256 for i in range(60)]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("chunks", [[60], [17, 20, 3, 1, 1, 1, 17], [1] * 10 + [50], [59, 1]])
def test_chunked_prefill_and_decode_match_full_prefill(
    tiny_llama: tuple[Path, torch.nn.Module], engine_factory: Any, page_size: int,
    chunks: list[int],
) -> None:
    path, ref = tiny_llama
    driver = Driver(engine_factory(path, page_size=page_size))
    req = driver.new_req(SEQ)
    ours = torch.cat([driver.extend([req], [n])[0] for n in chunks])
    torch.testing.assert_close(ours, hf_logits(ref, SEQ), atol=TOL, rtol=0)


@pytest.mark.parametrize("page_size", [1, 4])
def test_mixed_batches_match_each_request_alone(
    tiny_llama: tuple[Path, torch.nn.Module], engine_factory: Any, page_size: int
) -> None:
    """Three requests at different stages share forwards: prefills, chunks and decodes."""
    path, ref = tiny_llama
    driver = Driver(engine_factory(path, page_size=page_size))
    seqs = [SEQ[:30], SEQ[5:26], SEQ[::3]]
    reqs = [driver.new_req(s) for s in seqs]
    plan = [[10, 1, 7], [19, 13, 1], [1, 7, 12]]  # per step: extend of each request
    got: list[list[torch.Tensor]] = [[] for _ in reqs]
    for step in plan:
        live = list(zip(reqs, step))
        outs = driver.extend([r for r, _ in live], [n for _, n in live])
        for (r, _), out in zip(live, outs):
            got[reqs.index(r)].append(out)
    for seq, parts in zip(seqs, got):
        torch.testing.assert_close(torch.cat(parts), hf_logits(ref, seq), atol=TOL, rtol=0)


def test_pages_are_shared_by_slot_not_by_position(
    tiny_llama: tuple[Path, torch.nn.Module], engine_factory: Any
) -> None:
    """Interleaved page allocation: requests' pages are not contiguous in the pool."""
    path, ref = tiny_llama
    driver = Driver(engine_factory(path, page_size=2))
    a, b = driver.new_req(SEQ[:20]), driver.new_req(SEQ[20:40])
    outs_a, outs_b = [], []
    for _ in range(10):
        out = driver.extend([a, b], [2, 2])
        outs_a.append(out[0])
        outs_b.append(out[1])
    torch.testing.assert_close(torch.cat(outs_a), hf_logits(ref, SEQ[:20]), atol=TOL, rtol=0)
    torch.testing.assert_close(torch.cat(outs_b), hf_logits(ref, SEQ[20:40]), atol=TOL, rtol=0)
