"""The FP8 KV storage (kvcache/quant.py): round trip, scale, saturation."""

from __future__ import annotations

import torch
from minisgl_worker.kvcache.quant import FP8, FP8_MAX, from_cache, to_cache


def test_round_trip_keeps_e4m3_precision() -> None:
    x = torch.randn(64, 8, 32) * 3
    back = from_cache(to_cache(x, FP8, 1.0), torch.float32, 1.0)
    assert to_cache(x, FP8, 1.0).dtype == FP8
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 of each value (normals)
    big = x.abs() > 2**-6
    assert ((back - x).abs()[big] <= x.abs()[big] * 2**-4 + 1e-6).all()


def test_the_scale_divides_on_the_way_in_and_multiplies_out() -> None:
    x = torch.tensor([1000.0, -2000.0, 3.0])
    stored = to_cache(x, FP8, 8.0)
    assert stored.float().tolist() == [128.0, -256.0, 0.375]
    assert from_cache(stored, torch.float32, 8.0).tolist() == [1024.0, -2048.0, 3.0]


def test_out_of_range_values_saturate_instead_of_turning_nan() -> None:
    x = torch.tensor([1e6, -1e6, 448.0, 500.0, float("inf")])
    stored = to_cache(x, FP8, 1.0).float()
    assert not stored.isnan().any()
    assert stored.tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, FP8_MAX, FP8_MAX]


def test_the_model_dtype_passes_through() -> None:
    x = torch.randn(5, 3)
    assert torch.equal(to_cache(x, torch.float32, 1.0), x)
    assert torch.equal(from_cache(x, torch.float32, 1.0), x)


def test_the_pool_hands_out_its_scales_only_when_fp8() -> None:
    """What the store and attention kernels take: (K scale, V scale) of the layer, or None
    for a model-dtype pool (stored as is)."""
    from minisgl_worker.kvcache import MHAKVPool

    fp8 = MHAKVPool(2, 4, 16, 2, 8, FP8, torch.device("cpu"), ([0.5, 2.0], [0.25, 4.0]))
    assert fp8.quantized and fp8.scales(1) == (2.0, 4.0)
    plain = MHAKVPool(2, 4, 16, 2, 8, torch.float32, torch.device("cpu"))
    assert not plain.quantized and plain.scales(1) is None
    assert MHAKVPool.bytes_per_token(2, 2, 8, FP8) * 2 == MHAKVPool.bytes_per_token(
        2, 2, 8, torch.bfloat16)
