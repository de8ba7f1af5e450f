from __future__ import annotations

from minisgl_worker.core import Req
from minisgl_worker.protocol import SamplingParams


def test_token_slice_equals_slicing_all_ids() -> None:
    req = Req(0, [1, 2, 3, 4], SamplingParams())
    req.output_ids = [5, 6, 7]
    for start in range(8):
        for end in range(start, 8):
            assert req.token_slice(start, end) == req.all_ids[start:end]


def test_lengths_follow_a_request_through_a_step() -> None:
    req = Req(0, [1, 2, 3], SamplingParams())
    assert (req.remain_len, req.can_sample, req.is_decoding) == (3, False, False)
    req.device_len = 3
    assert req.extend_len == 3 and req.can_sample
    req.cached_len = 3
    req.output_ids.append(9)
    assert (req.remain_len, req.total_len, req.is_decoding) == (1, 4, True)
