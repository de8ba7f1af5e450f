"""Each parallel layer at tp 2 and 3 (gloo, spawned CPU processes) against the same layer
unsliced: loaded from the same full tensors, every rank's output is the matching slice
(column-parallel) or the whole output (row-parallel, embedding, LM head). Covers an
uneven vocabulary (padded rows) and KV heads replicated when tp exceeds them."""

from __future__ import annotations

import pytest
import torch
from minisgl_worker.distributed import TPInfo, get_tp_info, set_tp_info
from minisgl_worker.layers import (
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)

from .tp_group import run_group

HIDDEN, D, T = 12, 4, 5


def _unsliced(build):  # type: ignore[no-untyped-def]
    """`build()` as a tp == 1 layer, whatever this process's TP info."""
    info = get_tp_info()
    set_tp_info(TPInfo())
    try:
        return build()
    finally:
        set_tp_info(info)


def _pair(build, tensors):  # type: ignore[no-untyped-def]
    """(unsliced layer, this rank's layer), both loaded from `tensors` {(shard, name): t}."""
    layers = _unsliced(build), build()
    for layer in layers:
        for (shard, name), full in tensors.items():
            layer.load(shard, name, full)
    return layers


def _check_qkv(heads: int, kv_heads: int) -> None:
    tp = get_tp_info()
    g = torch.Generator().manual_seed(1)
    parts = {"q": heads * D, "k": kv_heads * D, "v": kv_heads * D}
    tensors = {(s, n): torch.randn((rows, HIDDEN) if n == "weight" else (rows,), generator=g)
               for s, rows in parts.items() for n in ("weight", "bias")}
    ref, layer = _pair(lambda: QKVParallelLinear(HIDDEN, D, heads, kv_heads, bias=True), tensors)
    x = torch.randn(T, HIDDEN, generator=g)
    q, k, v = ref(x).split(list(parts.values()), dim=-1)
    local_q, local_kv = heads // tp.size, max(1, kv_heads // tp.size)
    kv_head = tp.rank * kv_heads // tp.size  # the KV head of this rank's query heads
    want = torch.cat([q[:, tp.rank * local_q * D : (tp.rank + 1) * local_q * D],
                      k[:, kv_head * D : (kv_head + local_kv) * D],
                      v[:, kv_head * D : (kv_head + local_kv) * D]], dim=-1)
    torch.testing.assert_close(layer(x), want)


def _check_gate_up_and_down() -> None:
    tp = get_tp_info()
    g = torch.Generator().manual_seed(2)
    inter = 6 * tp.size
    tensors = {(s, "weight"): torch.randn(inter, HIDDEN, generator=g) for s in ("gate", "up")}
    ref, layer = _pair(lambda: MergedColumnParallelLinear(
        HIDDEN, {"gate": inter, "up": inter}), tensors)
    x = torch.randn(T, HIDDEN, generator=g)
    gate, up = ref(x).chunk(2, dim=-1)
    cols = slice(tp.rank * 6, (tp.rank + 1) * 6)
    torch.testing.assert_close(layer(x), torch.cat([gate[:, cols], up[:, cols]], dim=-1))

    down = {(None, "weight"): torch.randn(HIDDEN, inter, generator=g),
            (None, "bias"): torch.randn(HIDDEN, generator=g)}
    ref, layer = _pair(lambda: RowParallelLinear(inter, HIDDEN, bias=True), down)
    h = torch.randn(T, inter, generator=g)
    torch.testing.assert_close(layer(h[:, cols]), ref(h))  # all-reduced: the whole sum


def _check_vocab(vocab: int) -> None:
    g = torch.Generator().manual_seed(3)
    tensors = {(None, "weight"): torch.randn(vocab, HIDDEN, generator=g)}
    ref, layer = _pair(lambda: VocabParallelEmbedding(vocab, HIDDEN), tensors)
    ids = torch.tensor([0, vocab - 1, 3, vocab // 2, 1, vocab - 2])
    torch.testing.assert_close(layer(ids), ref(ids))

    ref, layer = _pair(lambda: LMHead(vocab, HIDDEN), tensors)
    hidden = torch.randn(T, HIDDEN, generator=g)
    torch.testing.assert_close(layer(hidden), ref(hidden))
    out = torch.empty(T, vocab)
    torch.testing.assert_close(layer(hidden, out=out), ref(hidden))
    torch.testing.assert_close(out, ref(hidden))


def _check_all(heads: int, kv_heads: int, replicated_kv: int, vocab: int) -> None:
    torch.manual_seed(0)
    _check_qkv(heads, kv_heads)
    _check_qkv(heads, replicated_kv)
    _check_gate_up_and_down()
    _check_vocab(vocab)


@pytest.mark.parametrize("tp", [2, 3])
def test_parallel_layers_match_unsliced(tp: int) -> None:
    # tp 2: 4 query / 2 KV heads split; 1 KV head replicated; vocab 11 padded to 12.
    # tp 3: 6 query / 3 KV heads split; 1 KV head replicated; vocab 10 padded to 12.
    vocab = 11 if tp == 2 else 10
    run_group(tp, _check_all, 2 * tp, tp, 1, vocab)
