"""Turns last-token logits into next tokens, per request.

Order of processing, per row: penalties (frequency/presence over generated tokens,
repetition over prompt + generated), logit_bias, min_new_tokens masking (EOS unless
ignore_eos, and the stop ids), the grammar's next-token mask (constrained requests,
constrain/), temperature; then greedy rows take the argmax, sampling
rows apply top-k, top-p, min-p and draw (seeded requests from their own generator).

Reported logprobs are the log-softmax of the *processed* logits: after penalties, masking
and temperature (1 for greedy), before top-k/top-p/min-p truncation, so alternatives that
the truncation removed still have finite values.

Fast paths: a batch of plain greedy requests (no penalties, masks or logprobs) is a single
argmax; on CUDA, a batch whose rows need nothing but temperature and their grammar masks
(no penalties, bias, min_new_tokens, logprobs or truncation) draws in one Triton pass that
applies the masks too (gumbel.py). Greedy rows never pay for the sort that top-k/top-p
needs. Greedy, temperature, top-k, top-p, min-p and seeds run without a host sync (sampling
without a CUDA sync is what lets the overlap loop run ahead); penalties, min_new_tokens
masks and logprobs sync. Under overlap a request's newest token may still be pending on the
host: the penalties read it from the engine's token pool (`newest`), on the device. A grammar
mask needs the request's newest token on the host: under overlap the scheduler hands over
the masks a helper thread filled ahead through `masks`, which the sampler calls when it
needs them (scheduler.py, constrain/prefetch.py); rows not filled ahead are filled here.
What the sampler reads of a request's progress (its token count) it reads before that call.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..constrain import MaskFiller, ReadyMasks, apply_bitmask
from ..core import PENDING_TOKEN, Req, ReqStatus
from ..transfer import HostValues, to_device, to_device_packed, upload


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # (B,) int64, on the logits' device
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def _has_penalty(req: Req) -> bool:
    s = req.sampling
    return s.frequency_penalty != 0 or s.presence_penalty != 0 or s.repetition_penalty != 1


def _stop_masked(req: Req) -> bool:
    return len(req.output_ids) < req.sampling.min_new_tokens


def _is_plain(req: Req) -> bool:
    """Nothing to do to its logits but temperature and its grammar's mask (both of which
    the Triton draw applies)."""
    s = req.sampling
    return not (s.logprobs or s.logit_bias or _has_penalty(req) or _stop_masked(req))


def _is_plain_greedy(req: Req) -> bool:
    return req.sampling.is_greedy and _is_plain(req) and req.matcher is None


def _truncates(req: Req) -> bool:
    s = req.sampling
    return s.top_k > 0 or s.top_p < 1 or s.min_p > 0


class Sampler:
    def __init__(self, eos_token_ids: list[int], device: torch.device,
                 newest: torch.Tensor | None = None) -> None:
        """newest: each request slot's newest sampled token (the engine's token pool), read
        where the host has it only as PENDING_TOKEN."""
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self.newest = newest
        self._fused = device.type == "cuda"  # Triton one-pass draws (gumbel.py)
        self._rng = random.Random()  # seeds of unseeded requests' fused draws
        self._masks = MaskFiller(pin=device.type == "cuda")

    def sample(self, logits: torch.Tensor, reqs: list[Req],
               masks: Callable[[], ReadyMasks | None] | None = None) -> SampleOutput:
        """logits (B, V) in the model's dtype, one row per request in `reqs`; left as they
        are. masks: returns the grammar masks filled ahead, if any (see the module
        docstring). No host sync unless a request asks for penalties, min_new_tokens
        masking or logprobs."""
        assert logits.shape[0] == len(reqs)
        none: list[None] = [None] * len(reqs)
        # The two fast paths read the logits as they are (argmax and the Triton draw are
        # exact on bf16); the rest works on a float32 copy.
        if all(_is_plain_greedy(r) for r in reqs):
            return SampleOutput(logits.argmax(-1), list(none), list(none))
        counts = [len(r.output_ids) for r in reqs]  # tokens before this one (maybe pending)
        if self._fused and all(_is_plain(r) and not _truncates(r) for r in reqs):
            grammar = self._grammar_masks(reqs, counts, logits.shape[1], masks)
            return SampleOutput(self._gumbel(logits, reqs, counts, False, grammar),
                                list(none), list(none))
        logits = logits.float()  # a copy in bf16/fp16; float32 (CPU) is edited in place
        for i, req in enumerate(reqs):
            if _has_penalty(req):
                self._apply_penalties(logits[i], req)
            if req.sampling.logit_bias:
                ids, bias = zip(*req.sampling.logit_bias)
                logits[i, list(ids)] += to_device(list(bias), self.device, logits.dtype)
            if _stop_masked(req):
                stop_ids = list(req.sampling.stop_token_ids)
                if not req.sampling.ignore_eos:
                    stop_ids += self.eos_token_ids
                logits[i, stop_ids] = float("-inf")
        grammar = self._grammar_masks(reqs, counts, logits.shape[1], masks)
        if grammar is not None:
            apply_bitmask(logits, *grammar)
        temps = [r.sampling.temperature if not r.sampling.is_greedy else 1.0 for r in reqs]
        # Times the float32 reciprocal, as the Triton draw scales (gumbel.py): both paths
        # then see the same scaled logits, bit for bit.
        logits.mul_(to_device(temps, self.device, torch.float32).reciprocal()[:, None])
        tokens = logits.argmax(-1)
        rows = [i for i, r in enumerate(reqs) if not r.sampling.is_greedy]
        if len(rows) == len(reqs):
            tokens = self._draw(logits, reqs, counts)
        elif rows:
            index = to_device(rows, self.device, torch.long)
            tokens[index] = self._draw(logits[index], [reqs[i] for i in rows],
                                       [counts[i] for i in rows])
        logprobs, tops = self._logprobs(logits, tokens, reqs)
        return SampleOutput(tokens, logprobs, tops)

    def _grammar_masks(self, reqs: list[Req], counts: list[int], vocab: int,
                       masks: Callable[[], ReadyMasks | None] | None,
                       ) -> tuple[list[int], torch.Tensor] | None:
        """The constrained rows' masks (constrain/mask.py: the rows and their bitmask on
        the host), None without constrained rows; the scheduler has advanced each matcher
        to its request's newest token (an aborted request's token may never come: its row
        is dropped)."""
        if all(r.matcher is None for r in reqs):
            return None
        ready = masks() if masks is not None else None
        for req, count in zip(reqs, counts):  # each mask must follow the newest token
            assert (req.matcher is None or req.matcher.num_tokens == count
                    or req.status is ReqStatus.ABORTED), (req, count)  # aborted: dropped
        return self._masks.fill([r.matcher for r in reqs], vocab, ready)

    def _generated(self, req: Req) -> torch.Tensor:
        """The request's output tokens on the device. Under overlap the newest is still
        PENDING_TOKEN on the host (sampled by the batch in flight): it is read from the
        token pool's row of the request, which holds it until this sample is stored."""
        ids = req.output_ids
        pending = bool(ids) and ids[-1] == PENDING_TOKEN
        known = ids[:-1] if pending else ids
        assert PENDING_TOKEN not in known[-1:], "at most the newest token is pending"
        out = to_device(known, self.device, torch.long)
        if pending:
            assert self.newest is not None, "a pending token needs the token pool"
            out = torch.cat([out, self.newest[req.table_idx:req.table_idx + 1]])
        return out

    def _apply_penalties(self, row: torch.Tensor, req: Req) -> None:
        s, vocab = req.sampling, row.shape[0]
        out = self._generated(req)
        if out.numel() and (s.frequency_penalty != 0 or s.presence_penalty != 0):
            counts = torch.bincount(out, minlength=vocab)[:vocab].to(row.dtype)
            row -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0)
        if s.repetition_penalty != 1:
            # An id both in the prompt and the output gathers the same value twice and
            # writes the same result twice.
            prompt = to_device(sorted(set(req.input_ids)), self.device, torch.long)
            seen = torch.cat([prompt, out])
            vals = row[seen]
            row[seen] = torch.where(
                vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty
            )

    def _draw(self, logits: torch.Tensor, reqs: list[Req], counts: list[int]) -> torch.Tensor:
        """logits (S, V) of sampling rows, temperature applied -> (S,) drawn tokens. On
        CUDA the rows without truncation draw in one Triton pass, the others by `_race`:
        each row's way depends on its own parameters only, so a seeded request draws the
        same tokens whatever its neighbours."""
        if not self._fused:
            return self._race(logits, reqs)
        cuts = [_truncates(r) for r in reqs]
        if not any(cuts):
            return self._gumbel(logits, reqs, counts, scaled=True)
        if all(cuts):
            return self._race(logits, reqs)
        plain = [i for i, cut in enumerate(cuts) if not cut]
        cut = [i for i, c in enumerate(cuts) if c]
        tokens = torch.empty(len(reqs), dtype=torch.long, device=logits.device)
        index = to_device(plain, self.device, torch.long)
        tokens[index] = self._gumbel(logits[index], [reqs[i] for i in plain],
                                     [counts[i] for i in plain])
        index = to_device(cut, self.device, torch.long)
        tokens[index] = self._race(logits[index], [reqs[i] for i in cut])
        return tokens

    def _gumbel(self, logits: torch.Tensor, reqs: list[Req], counts: list[int],
                scaled: bool = True,
                grammar: tuple[list[int], torch.Tensor] | None = None) -> torch.Tensor:
        """One Triton pass (gumbel.py). scaled: the temperature was applied already. A
        seeded request's noise is keyed by its seed and token count, others' by a host RNG.
        grammar: the constrained rows and their bitmask (`_grammar_masks`), applied in the
        pass."""
        from .gumbel import gumbel_sample

        temps = [1.0 if scaled else r.sampling.temperature for r in reqs]  # 0: greedy
        seeds = [
            self._rng.getrandbits(63) if r.sampling.seed is None
            else (r.sampling.seed * 0x9E3779B97F4A7C15 + count) & (2**63 - 1)
            for r, count in zip(reqs, counts)
        ]
        # They cross in one copy: the temperatures as float32 bits in int64 words (padded
        # to a whole word), each part 16-byte aligned (transfer.to_device_packed).
        n = len(reqs)
        temps32 = np.zeros(n + n % 2, dtype=np.float32)
        temps32[:n] = temps
        arrays: list[HostValues] = [seeds, temps32.view(np.int64)]
        if grammar is not None and grammar[0]:
            mask_rows = np.full(n, -1, dtype=np.int64)  # each row's bitmask row, -1: none
            mask_rows[grammar[0]] = np.arange(len(grammar[0]))
            arrays.append(mask_rows)
        seeds_t, temps_t, *rest = to_device_packed(arrays, self.device)
        bitmask = upload(grammar[1], self.device) if rest else None  # type: ignore[index]
        return gumbel_sample(logits, temps_t.view(torch.float32)[:n], seeds_t, bitmask,
                             rest[0] if rest else None)

    def _race(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """The torch draw (CPU, and truncated rows on CUDA).

        Exponential-race sampling: argmax(p / E) with E ~ Exp(1) i.i.d. picks token i with
        probability p_i, like torch.multinomial, but with no host sync and one batched
        noise draw; a seeded request's row of noise comes from its own generator, so its
        draws do not depend on its batch neighbours."""
        probs = torch.softmax(logits, dim=-1)
        top_k = [r.sampling.top_k for r in reqs]
        top_p = [r.sampling.top_p for r in reqs]
        if any(k > 0 for k in top_k) or any(p < 1 for p in top_p):
            probs = self._top_k_top_p(probs, top_k, top_p)
        min_p = [r.sampling.min_p for r in reqs]
        if any(p > 0 for p in min_p):
            floor = to_device(min_p, self.device, probs.dtype)[:, None] * probs.amax(-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
        noise = torch.empty_like(probs)
        if any(r.sampling.seed is None for r in reqs):
            noise.exponential_()
        for i, req in enumerate(reqs):  # a seeded request draws from its own generator
            if req.sampling.seed is not None:
                noise[i].exponential_(generator=self._generator(req))
        # Exp(1) can round to 0: keep p / E finite (0 / 0 would be NaN and win argmax).
        return (probs / noise.clamp_(min=1e-20)).argmax(-1)

    def _top_k_top_p(
        self, probs: torch.Tensor, top_k: list[int], top_p: list[float]
    ) -> torch.Tensor:
        sorted_p, idx = probs.sort(dim=-1, descending=True)  # (S, V)
        vocab = probs.shape[1]
        ks = to_device([k if k > 0 else vocab for k in top_k], self.device, torch.long)
        ranks = torch.arange(vocab, device=probs.device)[None, :]
        drop = ranks >= ks[:, None]
        ps = to_device(top_p, self.device, probs.dtype)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop |= (sorted_p.cumsum(-1) - sorted_p) >= ps[:, None]
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        return torch.zeros_like(probs).scatter_(1, idx, sorted_p)

    def _generator(self, req: Req) -> torch.Generator:
        assert req.sampling.seed is not None
        if req.generator is None:
            req.generator = torch.Generator(device=self.device)
            req.generator.manual_seed(req.sampling.seed)
        return req.generator

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, tokens: torch.Tensor, reqs: list[Req]
    ) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
        logprobs: list[float | None] = [None] * len(reqs)
        tops: list[list[tuple[int, float]] | None] = [None] * len(reqs)
        rows = [i for i, r in enumerate(reqs) if r.sampling.logprobs]
        if not rows:
            return logprobs, tops
        lp = torch.log_softmax(logits[rows], dim=-1).cpu()
        toks = tokens[rows].cpu()
        for j, i in enumerate(rows):
            logprobs[i] = float(lp[j, toks[j]])
            n = reqs[i].sampling.top_logprobs
            if n > 0:
                vals, ids = lp[j].topk(n)
                tops[i] = [(int(t), float(v)) for t, v in zip(ids, vals)]
        return logprobs, tops
