"""Programmatic dependent launch (PDL) for our Triton kernels."""

from __future__ import annotations

from functools import cache

import torch


@cache
def launches_pdl(device: torch.device) -> bool:
    """Whether Triton kernels on `device` launch with programmatic dependent launch (PDL,
    SM90 and up): a kernel's programs start while the previous kernel finishes, run what
    does not depend on it, and wait (`gdc_wait`) before reading its output. Inside CUDA
    graphs that hides most of the ~1-2 us launch gap before each such kernel."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
