"""The KV cache's size against the memory left for it (engine/memory.py)."""

from __future__ import annotations

import sys

import pytest
from minisgl_worker.engine.memory import (
    KVMemoryError,
    available_ram,
    check_kv_fits,
    fresh_requests,
)


def test_a_kv_cache_that_fits_passes() -> None:
    check_kv_fits(1000, 2048, 1000 * 2048, "on the test device")
    check_kv_fits(10**12, 2048, None, "where the free memory is unknown")


def test_a_kv_cache_one_token_too_large_names_the_flag_the_sizes_and_what_fits() -> None:
    with pytest.raises(KVMemoryError) as e:
        check_kv_fits(1001, 1 << 20, 1000 << 20, "on the test device")
    assert str(e.value) == ("--kv-tokens 1,001 needs 0.98 GiB of KV cache, but 0.98 GiB is left "
                            "for it on the test device: at most 1,000 tokens fit")


def test_no_memory_left_says_none_fit() -> None:
    with pytest.raises(KVMemoryError, match="0.00 GiB is left for it here: at most 0 tokens"):
        check_kv_fits(1, 16, -(1 << 30), "here")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_available_ram_is_read_on_linux() -> None:
    ram = available_ram()
    assert ram is not None and 1 << 20 < ram < 1 << 50


def test_a_profile_of_more_tokens_than_the_context_is_cut_into_requests_within_it() -> None:
    """The piecewise graphs' largest bucket (8,192 tokens by default) is profiled as fresh
    requests; one request of 8,192 tokens on a model of 512 positions read its RoPE table
    past the end (an illegal memory access on the GPU)."""
    assert fresh_requests(8192, 512) == [512] * 16
    assert fresh_requests(1000, 512) == [512, 488]
    assert fresh_requests(300, 40960) == [300]
