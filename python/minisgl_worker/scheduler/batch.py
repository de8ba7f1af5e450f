"""Packs the requests a step scheduled into one `Batch`: their extend tokens, positions and
KV slots back to back, uploaded in one copy."""

from __future__ import annotations

import numpy as np
import torch

from ..core import PENDING_TOKEN, Batch, Req
from ..transfer import to_device_packed


def build_batch(reqs: list[Req], locs: list[np.ndarray], device: torch.device) -> Batch:
    """reqs: decodes then prefill chunks, each with its device_len set; locs: each one's
    new KV slots. A decode whose newest token is still PENDING (overlap) reads it from the
    engine's token pool: pool_index / pool_slots say where."""
    ids: list[int] = []
    pos: list[int] = []
    pool_index: list[int] = []
    pool_slots: list[int] = []
    for req in reqs:
        ids += req.token_slice(req.cached_len, req.device_len)
        pos += range(req.cached_len, req.device_len)
        if ids[-1] == PENDING_TOKEN:  # only ever a decode's newest token
            ids[-1] = 0
            pool_index.append(len(ids) - 1)
            pool_slots.append(req.table_idx)
    out_loc = np.concatenate(locs)
    assert out_loc.shape[0] == len(ids) > 0
    sample_reqs = [r for r in reqs if r.can_sample]
    ids_t, pos_t, loc_t, index_t, slots_t, sample_rows = to_device_packed(
        [ids, pos, out_loc, pool_index, pool_slots, [r.table_idx for r in sample_reqs]],
        device,
    )
    return Batch(
        reqs=reqs,
        input_ids=ids_t,
        positions=pos_t,
        out_loc=loc_t,
        extend_lens=[r.extend_len for r in reqs],
        sample_reqs=sample_reqs,
        pool_index=index_t if pool_index else None,
        pool_slots=slots_t if pool_index else None,
        sample_rows=sample_rows,
    )
