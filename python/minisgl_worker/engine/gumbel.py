"""Sampling in one pass over the logits (CUDA, Triton): the Gumbel-max trick.

argmax_i (l_i / T + G_i) with G_i i.i.d. Gumbel(0, 1) picks token i with probability
softmax(l / T)_i, so a row needs neither a softmax nor a noise tensor: Triton programs
stream the row's logits once, draw its noise from Philox (`tl.rand4x`) keyed by the row's
seed and the token index, and keep a running argmax. Rows with temperature 0 take the plain
argmax. The torch path (Sampler._draw: softmax, an Exp(1) noise tensor, a division, an
argmax, ~10 passes over a (B, V) float32 tensor) cost ~0.5 ms of a decode step at batch 128
and vocabulary 152k on an H200.

The noise: G = -log(E) with E = -log(1 - U) ~ Exp(1), U uniform in [0, 1) on a 2^-31 grid;
for U < 0.01, E is its series U + U^2/2 + U^3/3 (error < 3e-7 relative), which keeps E's
small values (G's upper tail, which decides draws) at full resolution where 1 - U would
round them away. G's lower tail is cut at about -2.8 (probability below 1e-7). Both logs
are the hardware's approximate ones (`fast_logf`, lg2.approx: ~1e-7 absolute error, far
below what a draw can notice), and l / T is l times the float32 reciprocal of T, rounded
once (`mul_rn`, so no FMA contracts it): the Sampler's float32 path scales the same way,
so every path sees the same scaled logits bit for bit. The kernel is arithmetic-bound;
against exact logs and a correctly rounded division it ran 1.7-2x faster at 153-256 rows
of 151,936 on an H200 (benches/kernels/gumbel_kernel.py times
the kernel as it is).

A grammar's bitmask (constrained requests) can be applied in the same pass: a disallowed
token's logit reads as -inf, as the float32 path's `apply_bitmask` would set it, without
that path's float32 copy of the logits and unpacked (B, V) mask.

A row's draw depends only on its logits, temperature and seed, never on its neighbours:
the caller derives the seed from the request's own seed and its token count (or from a
host RNG for unseeded requests), which is what makes seeded requests reproducible."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

_BLOCK = 2048
_TARGET_PROGRAMS = 1024  # enough to fill an H200's 132 SMs several times over


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, stride, temps_ptr, seeds_ptr, best_ptr, index_ptr, vocab, span,
    bitmask_ptr, mask_rows_ptr, words, BLOCK: tl.constexpr, MASKED: tl.constexpr,
):
    """Program (row, part): the best score and its token over columns
    [part * span, (part + 1) * span) of the row. MASKED: a row with mask_rows[row] >= 0
    allows only the tokens whose bit is set in that row of the bitmask."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    splits = tl.num_programs(1)
    temp = tl.load(temps_ptr + row)
    seed = tl.load(seeds_ptr + row)
    if MASKED:
        mask_row = tl.load(mask_rows_ptr + row)
    safe_temp = tl.maximum(temp, 1e-30)
    inv_temp = tl.math.div_rn(1.0, safe_temp)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int32)
    for start in range(part * span, tl.minimum((part + 1) * span, vocab), BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        logit = tl.load(logits_ptr + row * stride + cols, mask=mask, other=float("-inf"))
        logit = logit.to(tl.float32)
        if MASKED:  # an unmasked row (mask_row < 0) reads all bits set
            word = tl.load(bitmask_ptr + mask_row * words + cols // 32,
                           mask=mask & (mask_row >= 0), other=-1)
            logit = tl.where(((word >> (cols % 32)) & 1) != 0, logit, float("-inf"))
        # One Philox call yields four uniforms: column start + 4j + i takes one of call j's
        # four (a fixed order), so the noise is a function of (seed, column) alone, at a
        # quarter of the cost of `tl.rand` per column (the RNG was most of the kernel's time).
        r0, r1, r2, r3 = tl.rand4x(seed, start // 4 + tl.arange(0, BLOCK // 4))
        u = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (BLOCK,))
        # Exp(1) = -log(1 - u); its series where 1 - u would round away u's low bits.
        expo = tl.where(u < 1e-2, u + u * u * (0.5 + u / 3), -libdevice.fast_logf(1 - u))
        scaled = libdevice.mul_rn(logit, inv_temp)
        score = tl.where(temp > 0, scaled - libdevice.fast_logf(expo), logit)
        score = tl.where(mask, score, float("-inf"))
        block_best = tl.max(score, 0)
        block_idx = tl.argmax(score, 0).to(tl.int32) + start
        take = block_best > best  # strict: ties keep the lower token, as torch.argmax
        best = tl.where(take, block_best, best)
        best_idx = tl.where(take, block_idx, best_idx)
    tl.store(best_ptr + row * splits + part, best)
    tl.store(index_ptr + row * splits + part, best_idx.to(tl.int64))


def gumbel_sample(logits: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor,
                  bitmask: torch.Tensor | None = None,
                  mask_rows: torch.Tensor | None = None) -> torch.Tensor:
    """logits (B, V) on CUDA (float32/bf16, rows contiguous), temps (B,) float32 (0 =
    greedy), seeds (B,) int64 -> (B,) int64 tokens, without a host sync. bitmask (M,
    ceil(V / 32)) int32 and mask_rows (B,) int64: row i samples only among the tokens
    allowed by bitmask[mask_rows[i]] (constrain/mask.py's layout), or among all of them
    where mask_rows[i] < 0; a masked row must allow at least one token.

    Each row is split over several programs (few rows would leave most SMs idle: one
    program per row took 176 us for 140 rows x 128k on an H200); a second, tiny pass picks
    each row's best part. The draw does not depend on the split."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    assert (bitmask is None) == (mask_rows is None)
    rows, vocab = logits.shape
    if not rows:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    words = 0  # int32 words of a bitmask row
    if bitmask is not None and mask_rows is not None:
        assert bitmask.dtype == torch.int32 and bitmask.is_contiguous()
        assert bitmask.shape[1] == triton.cdiv(vocab, 32) and mask_rows.shape == (rows,)
        words = bitmask.shape[1]
    blocks = triton.cdiv(vocab, _BLOCK)
    splits = max(1, min(blocks, _TARGET_PROGRAMS // rows))
    span = triton.cdiv(blocks, splits) * _BLOCK
    splits = triton.cdiv(vocab, span)
    best = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    index = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    _gumbel_argmax_kernel[(rows, splits)](
        logits, logits.stride(0), temps, seeds, best, index, vocab, span,
        seeds if bitmask is None else bitmask, seeds if mask_rows is None else mask_rows,
        words, BLOCK=_BLOCK, MASKED=bitmask is not None, num_warps=4,
    )
    if splits == 1:
        return index[:, 0]
    return index.gather(1, best.argmax(1, keepdim=True))[:, 0]
