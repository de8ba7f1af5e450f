"""`transfer`: host arrays to the device, packed or alone; on CUDA through the copy stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from minisgl_worker.transfer import to_device, to_device_packed, upload

arrays = st.lists(st.lists(st.integers(-(2**62), 2**62), max_size=9), max_size=6)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@given(arrays)
def test_views_hold_the_arrays_16_byte_aligned(values: list[list[int]]) -> None:
    views = to_device_packed([np.array(v, dtype=np.int64) for v in values], torch.device("cpu"))
    assert [v.tolist() for v in views] == values
    if views:
        base = views[0].data_ptr()
        assert all((v.data_ptr() - base) % 16 == 0 for v in views), "a view is misaligned"
        assert all(v.dtype == torch.int64 and v.is_contiguous() for v in views)


def test_to_device_converts_lists_and_arrays() -> None:
    cpu = torch.device("cpu")
    ints = to_device([3, -1, 7], cpu)
    assert ints.dtype == torch.int64 and ints.tolist() == [3, -1, 7]
    floats = to_device([0.5, 2.0], cpu, torch.float32)
    assert floats.dtype == torch.float32 and floats.tolist() == [0.5, 2.0]
    small = to_device(np.array([1, 2], dtype=np.int64), cpu, torch.int32)
    assert small.dtype == torch.int32 and small.tolist() == [1, 2]


@pytest.mark.gpu
@cuda
def test_cuda_copies_are_ordered_before_the_compute_stream_and_not_reused_early() -> None:
    """The compute stream reads an upload only after its copy, and the upload's memory is
    not handed to the next upload while the compute stream still has work queued on it:
    without `record_stream` the second upload below would reuse the first one's block at
    once (the copy stream does not wait for the sleeping compute stream) and overwrite it
    before the doubling reads it."""
    dev = torch.device("cuda")
    n = 1 << 16
    torch.cuda._sleep(200_000_000)  # keeps the compute stream busy for ~0.1 s
    a = to_device(np.arange(n), dev)
    doubled = a * 2  # queued behind the sleep
    del a
    b = to_device(np.full(n, -1), dev)
    torch.cuda.synchronize()
    assert torch.equal(doubled.cpu(), torch.arange(n) * 2)
    assert torch.equal(b.cpu(), torch.full((n,), -1))


@pytest.mark.gpu
@cuda
def test_cuda_upload_of_pinned_and_pageable_tensors() -> None:
    dev = torch.device("cuda")
    pinned = torch.arange(5, dtype=torch.int64, pin_memory=True)
    assert upload(pinned, dev).tolist() == [0, 1, 2, 3, 4]
    assert upload(torch.tensor([1.5, -2.0]), dev).tolist() == [1.5, -2.0]
    views = to_device_packed([[1], [2, 3], []], dev)
    assert [v.tolist() for v in views] == [[1], [2, 3], []]


@pytest.mark.gpu
@cuda
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # refused before any launch
def test_cuda_upload_inside_graph_capture_is_refused() -> None:
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(AssertionError, match="inside a CUDA graph"), torch.cuda.graph(graph):
        to_device([1, 2, 3], torch.device("cuda"))
