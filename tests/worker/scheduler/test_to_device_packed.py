"""`to_device_packed`: several host arrays crossing in one copy, as views of one buffer."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from minisgl_worker.scheduler.cache import to_device_packed

arrays = st.lists(st.lists(st.integers(-(2**62), 2**62), max_size=9), max_size=6)


@given(arrays)
def test_views_hold_the_arrays_16_byte_aligned(values: list[list[int]]) -> None:
    views = to_device_packed([np.array(v, dtype=np.int64) for v in values], torch.device("cpu"))
    assert [v.tolist() for v in views] == values
    if views:
        base = views[0].data_ptr()
        assert all((v.data_ptr() - base) % 16 == 0 for v in views), "a view is misaligned"
        assert all(v.dtype == torch.int64 and v.is_contiguous() for v in views)
