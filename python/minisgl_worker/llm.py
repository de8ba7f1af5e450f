"""The offline API: scheduler and engine in this process, no sockets.

    from minisgl_worker.llm import LLM
    llm = LLM("path/to/model", page_size=4, cache="radix")
    llm.generate(["Hello"], SamplingParams(max_new_tokens=8))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .engine import Engine, EngineConfig
from .protocol import Generate, SamplingParams
from .scheduler import Scheduler

__all__ = ["LLM", "SamplingParams"]


class LLM:
    def __init__(
        self, model_path: str | Path, chunk_size: int = 8192, cache: str = "radix",
        policy: str = "fcfs", mixed_chunk_size: int | None = None,
        mixed_step_tokens: int | None = None, **engine_options: Any,
    ):
        """cache: the prefix cache, "radix" or "naive"; policy, mixed_chunk_size and
        mixed_step_tokens: the scheduler's queue order and step budgets (scheduler/budget.py).
        engine_options are EngineConfig fields: device, dtype, page_size, max_running,
        kv_tokens, load_format, ..."""
        self.model_path = Path(model_path)
        self.engine = Engine(
            EngineConfig(model_path=str(model_path), chunk_size=chunk_size, **engine_options)
        )
        self.scheduler = Scheduler(self.engine, chunk_size=chunk_size, prefix_cache=cache,
                                   policy=policy, mixed_chunk_size=mixed_chunk_size,
                                   mixed_step_tokens=mixed_step_tokens)
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
        for input_ids, sp in zip(ids, plist):
            rid = self._next_rid
            self._next_rid += 1
            error = self.scheduler.add_request(Generate(rid, input_ids, sp))
            if error is not None:
                for added in results:  # leave the scheduler as it was
                    self.scheduler.abort(added)
                raise ValueError(error.message)
            results[rid] = _empty_result()
        while self.scheduler.has_work:
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

    def shutdown(self) -> None:
        self.engine.shutdown()


def _empty_result() -> dict[str, Any]:
    return {"token_ids": [], "logprobs": [], "top_logprobs": [], "finish_reason": None,
            "cached_tokens": 0}

