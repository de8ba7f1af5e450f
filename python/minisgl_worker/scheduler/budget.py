"""What the next step admits: the waiting queue's order and the step's prompt-token budget.

Order. First come, first served ("fcfs", the default), or longest max_new_tokens first
("lof", SGLang's name), for a batch submitted at once: the requests admitted last then
finish soonest.

Budget. A step takes at most `chunk_size` tokens, decodes included. A step with decodes
takes at most `mixed_chunk_size` prompt tokens (default: the chunk size), which bounds how
long a prompt stalls the running decodes. `mixed_step_tokens` N (default off) caps a step
at N tokens, decodes included, once N // 4 or more requests decode (prompts still get at
least N // 8 tokens a step, however many decode): prompt chunks then fill the rows that a decode
step's weight-bound GEMMs leave idle, where a prompt token costs about half what it costs
in a full chunk, while a step with fewer decodes still prefills a whole chunk. On the H200
offline workload (benches/RESULTS.md), lof with 256 saves 5-6% on Llama-3.1-8B; on
Qwen3-0.6B, whose GEMMs are latency-bound, it gains nothing. And beside many decodes it
holds a long prompt to 32-192 tokens a step, a slow first token when serving online. So
neither setting is the default."""

from __future__ import annotations

from collections import deque

from ..core import Req

POLICIES = ("fcfs", "lof")


class StepBudget:
    def __init__(self, chunk_size: int, policy: str = "fcfs",
                 mixed_chunk_size: int | None = None, mixed_step_tokens: int | None = None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        if mixed_step_tokens is not None and mixed_step_tokens < 4:
            raise ValueError(f"mixed_step_tokens must be at least 4; got {mixed_step_tokens}")
        assert chunk_size >= 1
        self.chunk_size = chunk_size
        self.policy = policy
        self.mixed_chunk_size = min(mixed_chunk_size or chunk_size, chunk_size)
        assert self.mixed_chunk_size >= 1
        self.mixed_step_tokens = mixed_step_tokens

    @property
    def capped_from(self) -> int:
        """How many decodes a step needs for `mixed_step_tokens` to cap it (when set)."""
        return (self.mixed_step_tokens or 0) // 4

    def describe(self) -> str:
        """For the scheduler's start-up log line."""
        steps = self.mixed_step_tokens
        capped = f", steps of {steps} from {self.capped_from} decodes" if steps else ""
        beside = f"{self.mixed_chunk_size} beside decodes{capped}"
        return f"chunk {self.chunk_size} ({beside}), {self.policy}"

    def enqueue(self, waiting: deque[Req], req: Req) -> None:
        i = len(waiting)
        if self.policy == "lof":  # after every waiting request with as long a max output
            n = req.sampling.max_new_tokens
            while i and waiting[i - 1].sampling.max_new_tokens < n:
                i -= 1
        waiting.insert(i, req)

    def prompt_tokens(self, num_decodes: int) -> int:
        """Prompt tokens a step may take beside `num_decodes` decodes (at least 1)."""
        budget = self.chunk_size - num_decodes
        if num_decodes:
            budget = min(budget, self.mixed_chunk_size)
            cap = self.mixed_step_tokens
            if cap and num_decodes >= self.capped_from:
                budget = min(budget, max(cap - num_decodes, cap // 8))
        return max(budget, 1)
