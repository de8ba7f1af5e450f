"""The offline API: scheduler and engine in this process, no sockets.

    from minisgl_worker.llm import LLM
    llm = LLM("path/to/model", page_size=4, cache="radix")
    llm.generate(["Hello"], SamplingParams(max_new_tokens=8))

With `tp=N` this process is rank 0 of a TP group and spawns ranks 1..N-1 (each runs the
worker's `follow` loop on its own engine); every step, rank 0 broadcasts what it added
before stepping, as a worker's rank 0 does. Grammars compile here before `generate` runs
(a bad one raises first): each constrained request is followed by the word that its
grammar compiled, which the other ranks wait for (scheduler/compiling.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .distributed import TPInfo, destroy_distributed, get_comm, init_distributed
from .distributed.ranks import LocalRanks, free_addr, rank_device, share_cores
from .engine import Engine, EngineConfig
from .protocol import Generate, RouterMsg, SamplingParams, Shutdown
from .scheduler import Scheduler, follow
from .scheduler.loop import DropPrefixCache, GrammarCompiled

__all__ = ["LLM", "SamplingParams"]


class LLM:
    def __init__(
        self, model_path: str | Path, chunk_size: int = 8192, cache: str = "radix",
        policy: str | None = None, mixed_chunk_size: int | None = None,
        mixed_step_tokens: int | None = None, tp: int = 1, overlap: bool | None = None,
        **engine_options: Any,
    ):
        """cache: the prefix cache, "radix" or "naive"; policy, mixed_chunk_size and
        mixed_step_tokens: the scheduler's queue order and step budgets, None = derived for a
        batch job from the model and the GPU (scheduler/budget.py);
        tp: tensor-parallel ranks (GPUs 0..tp-1 on CUDA); overlap: overlap scheduling on
        every rank, None = the scheduler's default (on for CUDA). engine_options are
        EngineConfig fields: device, dtype, page_size, max_running, kv_tokens, load_format,
        ..."""
        assert tp >= 1, f"tp must be >= 1; got {tp}"
        self.model_path = Path(model_path)
        options = dict(model_path=str(model_path), chunk_size=chunk_size, **engine_options)
        sched: dict[str, Any] = {
            "chunk_size": chunk_size, "prefix_cache": cache, "policy": policy,
            "mixed_chunk_size": mixed_chunk_size, "mixed_step_tokens": mixed_step_tokens,
            "offline": True, "overlap": overlap}
        self._ranks: LocalRanks | None = None
        if tp > 1:
            addr = free_addr()
            self._ranks = LocalRanks(_follower, (options, sched, addr, tp), range(1, tp))
            self._ranks.start()
            options["device"] = str(_join(options, addr, TPInfo(0, tp)))
        self.engine = Engine(EngineConfig(**options))
        self.scheduler = Scheduler(self.engine, **sched)
        self._tokenizer: Any = None
        self._next_rid = 0

    @property
    def tokenizer(self) -> Any:
        """The folder's tokenizer.json via the `tokenizers` package, loaded on first use."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        return self._tokenizer

    def generate(
        self,
        prompts: list[list[int]] | list[str],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[dict[str, Any]]:
        """One dict per prompt, in order: token_ids, finish_reason, cached_tokens, logprobs
        (when asked for), and text when the folder has a tokenizer.json."""
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        assert len(plist) == len(prompts), "one SamplingParams per prompt"
        ids = [self.tokenizer.encode(p).ids if isinstance(p, str) else list(p) for p in prompts]
        results: dict[int, dict[str, Any]] = {}
        added: list[RouterMsg | GrammarCompiled] = []
        now = time.monotonic()  # one arrival for the batch, on every rank
        for input_ids, sp in zip(ids, plist):
            msg = Generate(self._next_rid, input_ids, sp)
            self._next_rid += 1
            error = self.scheduler.add_request(msg, arrival=now)
            if error is not None:  # the other ranks have not seen any of them yet
                for rid in results:  # leave the scheduler as it was
                    self.scheduler.abort(rid)
                raise ValueError(error.message)
            results[msg.rid] = _empty_result()
            added.append(msg)
            if sp.constraint is not None:
                added.append(GrammarCompiled(msg.rid))
        while self.scheduler.has_work:
            self._broadcast(added, now)
            added = []
            for out in self.scheduler.step():
                res = results[out.rid]
                res["token_ids"].append(out.token)
                res["logprobs"].append(out.logprob)
                res["top_logprobs"].append(out.top_logprobs)
                res["finish_reason"], res["cached_tokens"] = out.finish, out.cached_tokens
        ordered = [results[rid] for rid in sorted(results)]
        if (self.model_path / "tokenizer.json").exists():
            for res in ordered:
                res["text"] = self.tokenizer.decode(res["token_ids"])
        return ordered

    def drop_prefix_cache(self) -> None:
        """Evict every cached prefix on every rank (between a benchmark's repetitions)."""
        self.scheduler.drop_prefix_cache()
        self._broadcast([DropPrefixCache()])

    def _broadcast(self, msgs: Sequence[RouterMsg | DropPrefixCache | GrammarCompiled],
                   now: float = 0.0) -> None:
        """The other ranks apply `msgs` (applied here already; `now`: its requests' arrival)
        and step with us (scheduler/loop.py's `follow`)."""
        if self._ranks is not None:
            get_comm().broadcast_objects([now, list(msgs)])

    def shutdown(self) -> None:
        if self._ranks is not None:
            self._broadcast([Shutdown()])
            self._ranks.stop(grace_s=30)
            self._ranks = None
        self.scheduler.shutdown()
        self.engine.shutdown()
        destroy_distributed()


def _join(options: dict[str, Any], addr: str, info: TPInfo) -> Any:
    """Join the group as `info.rank` -> this rank's device."""
    device = rank_device(options.get("device", "auto"), info.rank, info.size)
    share_cores(device, info.size)
    init_distributed(info, addr, device)
    return device


def _follower(options: dict[str, Any], sched: dict[str, Any], addr: str, tp: int,
              rank: int) -> None:
    """Rank `rank` of an LLM's group (a spawned process)."""
    options = {**options, "device": str(_join(options, addr, TPInfo(rank, tp)))}
    engine = Engine(EngineConfig(**options))
    scheduler = Scheduler(engine, **sched)
    try:
        follow(scheduler, get_comm())
    finally:
        scheduler.shutdown()
        engine.shutdown()
        destroy_distributed()


def _empty_result() -> dict[str, Any]:
    return {"token_ids": [], "logprobs": [], "top_logprobs": [], "finish_reason": None,
            "cached_tokens": 0}
