"""StaticInputs, the buffers CUDA graphs read (the class is device-agnostic, so on CPU)."""

from __future__ import annotations

import pytest
import torch
from minisgl_worker.core import Batch
from minisgl_worker.engine.graphs.capture import StaticInputs

DUMMY = 160  # the pool's dummy page 10 at page size 16


def _batch(inputs: StaticInputs, ids: list[int], start: int) -> Batch:
    batch = inputs.batch(len(ids), [1] * len(ids))  # then given its own tensors
    batch.input_ids = torch.tensor(ids)
    batch.positions = torch.arange(start, start + len(ids))
    batch.out_loc = torch.arange(100 + start, 100 + start + len(ids))
    return batch


def test_load_fills_the_rows_and_sends_the_padding_to_the_dummy_slot() -> None:
    inputs = StaticInputs(8, DUMMY, torch.device("cpu"))
    assert inputs.out_loc.tolist() == [DUMMY] * 8
    inputs.load(_batch(inputs, [5, 6, 7, 8, 9, 10], start=20), padded=6)
    inputs.load(_batch(inputs, [1, 2, 3], start=7), padded=4)  # rows 3.. were the big one's
    assert inputs.input_ids[:3].tolist() == [1, 2, 3]
    assert inputs.positions[:4].tolist() == [7, 8, 9, 0]
    assert inputs.out_loc[:4].tolist() == [107, 108, 109, DUMMY]
    assert inputs.out_loc[4:6].tolist() == [124, 125]  # beyond the padded graph: not read


def test_batch_views_the_buffers() -> None:
    inputs = StaticInputs(8, DUMMY, torch.device("cpu"))
    batch = inputs.batch(4, [4])
    assert batch.input_ids.data_ptr() == inputs.input_ids.data_ptr()
    assert batch.out_loc.tolist() == [DUMMY] * 4 and batch.extend_lens == [4]


def test_load_rejects_a_batch_larger_than_its_graph() -> None:
    inputs = StaticInputs(8, DUMMY, torch.device("cpu"))
    with pytest.raises(AssertionError):
        inputs.load(_batch(inputs, [1, 2, 3], start=0), padded=2)
    with pytest.raises(AssertionError):
        inputs.load(_batch(inputs, [1] * 4, start=0), padded=9)
