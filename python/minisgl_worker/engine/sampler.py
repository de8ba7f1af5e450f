"""Turns last-token logits into next tokens, per request.

Order of processing, per row: penalties (frequency/presence over generated tokens,
repetition over prompt + generated), min_new_tokens masking (EOS unless ignore_eos, and the
stop ids), temperature; then greedy rows take the argmax, sampling rows apply top-k, top-p,
min-p and draw (seeded requests from their own generator).

Reported logprobs are the log-softmax of the *processed* logits: after penalties, masking
and temperature (1 for greedy), before top-k/top-p/min-p truncation, so alternatives that
the truncation removed still have finite values.

Fast path: a batch of plain greedy requests (no penalties, masks or logprobs) is a single
argmax, and greedy rows never pay for the sort that top-k/top-p needs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core import Req


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # (B,) int64, on the logits' device
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def _has_penalty(req: Req) -> bool:
    s = req.sampling
    return s.frequency_penalty != 0 or s.presence_penalty != 0 or s.repetition_penalty != 1


def _stop_masked(req: Req) -> bool:
    return len(req.output_ids) < req.sampling.min_new_tokens


def _is_plain_greedy(req: Req) -> bool:
    s = req.sampling
    return s.is_greedy and not (s.logprobs or _has_penalty(req) or _stop_masked(req))


class Sampler:
    def __init__(self, eos_token_ids: list[int], device: torch.device) -> None:
        self.eos_token_ids = list(eos_token_ids)
        self.device = device

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> SampleOutput:
        """logits (B, V) float32, one row per request in `reqs`."""
        assert logits.shape[0] == len(reqs)
        none: list[None] = [None] * len(reqs)
        if all(_is_plain_greedy(r) for r in reqs):
            return SampleOutput(logits.argmax(-1), list(none), list(none))
        for i, req in enumerate(reqs):
            if _has_penalty(req):
                self._apply_penalties(logits[i], req)
            if _stop_masked(req):
                stop_ids = list(req.sampling.stop_token_ids)
                if not req.sampling.ignore_eos:
                    stop_ids += self.eos_token_ids
                logits[i, stop_ids] = float("-inf")
        temps = [r.sampling.temperature if not r.sampling.is_greedy else 1.0 for r in reqs]
        logits.div_(torch.tensor(temps, device=logits.device)[:, None])
        tokens = logits.argmax(-1)
        rows = [i for i, r in enumerate(reqs) if not r.sampling.is_greedy]
        if rows:
            tokens[rows] = self._draw(logits[rows], [reqs[i] for i in rows])
        logprobs, tops = self._logprobs(logits, tokens, reqs)
        return SampleOutput(tokens, logprobs, tops)

    def _apply_penalties(self, row: torch.Tensor, req: Req) -> None:
        s, vocab = req.sampling, row.shape[0]
        if req.output_ids and (s.frequency_penalty != 0 or s.presence_penalty != 0):
            out = torch.tensor(req.output_ids, device=row.device)
            counts = torch.bincount(out, minlength=vocab)[:vocab].to(row.dtype)
            row -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0)
        if s.repetition_penalty != 1:
            seen = torch.tensor(sorted(set(req.all_ids)), device=row.device)
            vals = row[seen]
            row[seen] = torch.where(
                vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty
            )

    def _draw(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """logits (S, V) of sampling rows, temperature applied -> (S,) drawn tokens."""
        probs = torch.softmax(logits, dim=-1)
        top_k = [r.sampling.top_k for r in reqs]
        top_p = [r.sampling.top_p for r in reqs]
        if any(k > 0 for k in top_k) or any(p < 1 for p in top_p):
            probs = self._top_k_top_p(probs, top_k, top_p)
        min_p = torch.tensor([r.sampling.min_p for r in reqs], device=probs.device)
        if bool((min_p > 0).any()):
            keep = probs >= min_p[:, None] * probs.max(-1, keepdim=True).values
            probs = probs * keep
        out = torch.empty(len(reqs), dtype=torch.long, device=probs.device)
        unseeded = [i for i, r in enumerate(reqs) if r.sampling.seed is None]
        if unseeded:  # one batched draw from the global generator
            out[unseeded] = torch.multinomial(probs[unseeded], 1)[:, 0]
        for i, req in enumerate(reqs):  # a seeded request draws from its own generator
            if req.sampling.seed is not None:
                out[i] = torch.multinomial(probs[i], 1, generator=self._generator(req))[0]
        return out

    @staticmethod
    def _top_k_top_p(probs: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
        sorted_p, idx = probs.sort(dim=-1, descending=True)  # (S, V)
        vocab = probs.shape[1]
        ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=probs.device)
        ranks = torch.arange(vocab, device=probs.device)[None, :]
        drop = ranks >= ks[:, None]
        ps = torch.tensor(top_p, device=probs.device, dtype=probs.dtype)
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
