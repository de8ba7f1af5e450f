"""Small host arrays to the device without a host sync, off the compute stream.

Every step sends a few host arrays to the GPU: the batch's token ids, positions and KV slots,
the page-table writes, the decode plan's sizes, the sampler's seeds. A pinned copy queued on
the compute stream waits for the kernels before it, and the kernel after it waits for the
copy: a torch.profiler trace of the offline workload showed ~2.4 us of copy plus 4-8 us of
idle on either side of each, five a decode step, all between one step's LM head and the
next step's graph (benches/HISTORY.md, "Between two decode steps").

Here the copy runs on a side stream, one per device, and starts as soon as the host issues
it, under the previous step's kernels; the compute stream only waits for its event. The
result is allocated on the side stream and marked as used by the compute stream
(`record_stream`), so the caching allocator does not hand its memory to the side stream
again until the compute stream's work on it is done. Not for use inside a CUDA graph's
capture (asserted). On the CPU the array is simply converted (the result may share its
memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch

HostValues = np.ndarray | Sequence[int] | Sequence[float]


def to_device(values: HostValues, device: torch.device,
              dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A host array or list on `device` as `dtype` (see the module docstring)."""
    host = torch.as_tensor(np.asarray(values), dtype=dtype)
    return upload(host, device)


def to_device_packed(arrays: Sequence[HostValues], device: torch.device) -> list[torch.Tensor]:
    """Several host arrays on the device as int64 views of one buffer: one copy instead of
    one each. Each view starts 16-byte aligned: Triton specializes kernels on their
    pointers' alignment, and a misaligned view cost a second compile (~0.15 s) of the RoPE
    + KV-store kernel in the middle of a run (benches/HISTORY.md)."""
    flat = [np.asarray(a, dtype=np.int64) for a in arrays]
    starts = np.cumsum([0] + [len(a) + len(a) % 2 for a in flat])  # even: 16-byte aligned
    host = torch.empty(int(starts[-1]), dtype=torch.int64, pin_memory=device.type == "cuda")
    packed = host.numpy()
    for a, start in zip(flat, starts):
        packed[start : start + len(a)] = a
    t = upload(host, device)
    return [t[start : start + len(a)] for a, start in zip(flat, starts)]


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: on CUDA copied from pinned memory (pinned here unless it
    is already) on the device's copy stream, ordered before the current stream's next work."""
    if device.type != "cuda":
        return host.to(device)
    # Captured, the copy would replay from a pinned block long since freed and reused.
    assert not torch.cuda.is_current_stream_capturing(), "host copy inside a CUDA graph"
    if not host.is_pinned():
        host = host.pin_memory()
    compute, side = torch.cuda.current_stream(device), _copy_stream(device)
    with torch.cuda.stream(side):
        t = host.to(device, non_blocking=True)
    t.record_stream(compute)
    compute.wait_stream(side)
    return t


@cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)
