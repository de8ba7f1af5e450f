"""The scheduler: requests in, batches to the engine, tokens out.

Each batch mixes every decoding request (one token each) with prefill chunks under the
token budget (continuous batching, chunked prefill mixed with decode).

Overlap scheduling (on by default on CUDA; MINISGL_DISABLE_OVERLAP=1 turns it off):
`step()` schedules and launches batch N+1, and only then waits for batch N's tokens and
processes them, so the host's work for one step runs while the GPU computes the previous
one. What makes that possible:
- launching a batch does its bookkeeping at once: its KV counts as cached, each sampling
  request gets a PENDING_TOKEN placeholder output, a finished prefill joins the decode set;
- the engine writes every sampled token into a per-slot token pool on the GPU, and a
  decode whose newest token is still PENDING reads its input from there;
- a request that turns out to have finished in batch N was already put in batch N+1 (one
  wasted token, unless its finish was certain: max_new_tokens or max_context); processing
  N frees its slot and pages, once. That is safe while N+1 still runs: every later batch
  that reuses them is queued behind N+1 on the same stream, and N+1's result for it is
  dropped. Aborts free the same way.
Without overlap, `step()` is schedule -> forward -> process, with the same bookkeeping.

Constrained requests (a grammar, constrain/; a new one compiles off the loop: compiling.py):
a row's mask for token N+1 needs token N on the host. A step whose batch has such rows
queues N+1's forward, then, when the sampler asks for the masks, waits for N's tokens,
moves the matchers, has a helper thread fill N+1's masks (constrain/prefetch.py) while it
processes the rest of N, books N+1 and plans N+2, and queues N+1's sampling: the GPU runs
N+1's forward meanwhile. The next step launches the planned N+2 as it is. Processing (or
an abort) may end requests of a batch planned already: a launch reads their table rows and
KV lengths from the batch (Batch.table_rows, kv_lens), and their tokens are dropped.

Which requests a step admits, in what order and how many prompt tokens: budget.py."""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path

import numpy as np

from ..constrain import GrammarCache, MaskPrefetch, ReadyMasks
from ..core import PENDING_TOKEN, Batch, Req, ReqStatus, first_pending
from ..engine import Engine, ForwardOutput
from ..kvcache import PageAllocator, create_prefix_cache
from ..protocol import Error, ErrorCode, Generate, TokenOutput
from .admission import admit
from .batch import build_batch
from .budget import GpuPeak, StepBudget, derive
from .cache import CacheManager
from .compiling import Compiling
from .decode import DecodeManager
from .finish import advance_matchers, finish_reason
from .prefill import PrefillAdder
from .table import TableManager
from .turns import in_flight_grammar, next_decodes

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self, engine: Engine, chunk_size: int = 8192, prefix_cache: str = "radix",
        overlap: bool | None = None, policy: str | None = None,
        mixed_chunk_size: int | None = None, mixed_step_tokens: int | None = None,
        offline: bool = False,
    ):
        """overlap: None = on for CUDA unless MINISGL_DISABLE_OVERLAP=1 (on CPU the
        forward is synchronous, so overlapping would only delay every output a step).
        policy, mixed_chunk_size, mixed_step_tokens: the StepBudget's, None = derived from
        the model and the GPU for serving, or for a batch job when `offline` (budget.py)."""
        derived = derive(engine.model_config, GpuPeak.of(engine.device), chunk_size, offline)
        self.budget = StepBudget.resolve(
            chunk_size, policy, mixed_chunk_size, mixed_step_tokens, derived)
        if overlap is None:
            off = os.environ.get("MINISGL_DISABLE_OVERLAP", "") in ("1", "true")
            overlap = engine.device.type == "cuda" and not off
        if engine.comm is not None:  # every rank must batch alike: rank 0's settings
            self.budget, overlap = engine.comm.broadcast_objects([self.budget, overlap])
        self.overlap = overlap
        self._inflight: tuple[Batch, ForwardOutput] | None = None  # launched, unprocessed
        self._next: Batch | None = None  # planned by a constrained step, not yet launched
        self.engine = engine
        self.page_size = engine.page_size
        self.max_context = engine.max_context
        self.eos_ids = set(engine.model_config.eos_token_ids)
        self.grammars = GrammarCache(
            Path(engine.config.model_path) / "tokenizer.json", engine.model_config.vocab_size,
            sorted(self.eos_ids))
        self.compiling = Compiling(self.grammars)  # held, not queued: grammars compile
        self.masks_ahead = MaskPrefetch(engine.device, engine.model_config.vocab_size)
        self.table = TableManager(engine.page_table)
        self.allocator = PageAllocator(engine.kv_pool.num_pages)
        self.cache = CacheManager(self.allocator, create_prefix_cache(prefix_cache, self.page_size),
                                  engine.page_table, self.page_size)
        self.reqs: dict[int, Req] = {}  # every live request, by rid
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []  # running, prompt not done (chunked)
        self.decode = DecodeManager()
        # Cumulative prompt tokens of requests that produced their first token, and how many
        # of them the prefix cache supplied (the `load` message's hit-rate counters).
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        logger.info("scheduler: cache %s, %s, overlap %s (defaults derived from %s)",
                    prefix_cache, self.budget.describe(), "on" if overlap else "off", derived.why)

    def add_request(self, msg: Generate, compile_now: bool = True,
                    arrival: float | None = None) -> Error | None:
        """Queues the request, or says why not. A grammar that is not cached compiles now,
        or with `compile_now` False (serving) on a helper thread: the request waits in
        `compiling` until `grammar_compiled(rid)`. `arrival` (time.monotonic() by default):
        rank 0's, in a TP group, so that every rank orders its queue alike."""
        if msg.rid in self.reqs:
            return Error(msg.rid, ErrorCode.BAD_MESSAGE, f"rid {msg.rid} is already running")
        req = admit(msg, self.engine, self.max_context)
        if isinstance(req, Error):
            return req
        if arrival is not None:
            req.arrival = arrival
        ready = self.compiling.attach(req, compile_now)
        if isinstance(ready, Error):
            return ready
        self.reqs[req.rid] = req
        if ready:
            self.budget.enqueue(self.waiting, req, self.cache)
        return None

    def grammar_compiled(self, rid: int) -> Error | None:
        """Queues a request whose grammar compiled, or ends it with the error."""
        done = self.compiling.finish(rid)
        if isinstance(done, Req):
            self.budget.enqueue(self.waiting, done, self.cache)
        elif done is not None:
            del self.reqs[rid]
        return done if isinstance(done, Error) else None

    def abort(self, rid: int) -> None:
        """Forget the request and free what it holds; unknown or finished rids are a no-op."""
        req = self.reqs.get(rid)
        if req is None:
            return
        if self.compiling.discard(rid):
            pass  # it waited for its grammar, in no queue
        elif req.status == ReqStatus.WAITING:
            self.waiting.remove(req)
        elif req in self.prefilling:
            self.prefilling.remove(req)
        else:
            self.decode.remove(req)
        self._end(req, ReqStatus.ABORTED)

    def shutdown(self) -> None:
        """Stops the grammar helper threads: the masks' (idle between steps), the compiles'."""
        self.masks_ahead.shutdown()
        self.grammars.shutdown()

    def drop_prefix_cache(self) -> None:
        """Evict every cached prefix (idle only): a benchmark's repetition starts cold."""
        assert not self.has_work
        self.allocator.free(self.cache.prefix_cache.evict(self.allocator.num_pages))

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or self._inflight is not None or self._next is not None

    @property
    def only_compiling(self) -> bool:
        """Every request held waits for its grammar: a step would have nothing to run."""
        return len(self.compiling) == len(self.reqs) and self._inflight is self._next is None

    def step(self) -> list[TokenOutput]:
        done, self._inflight = self._inflight, None  # batch N, launched by the last step
        outputs: list[TokenOutput] = []
        batch, self._next = self._next or self.schedule(), None  # planned by the last step?
        if batch is not None and self.overlap and any(
                in_flight_grammar(r) for r in batch.sample_reqs):  # masks wait for N
            (out, outputs), done = self._launch_constrained(batch, done), None
        elif batch is not None:
            out = self.launch(batch)
        if done is not None:
            outputs.extend(self.process_results(*done))
        if batch is not None:
            if self.overlap:
                self._inflight = (batch, out)
            else:
                outputs.extend(self.process_results(batch, out))
        return outputs

    def _launch_constrained(self, batch: Batch, done: tuple[Batch, ForwardOutput] | None,
                            ) -> tuple[ForwardOutput, list[TokenOutput]]:
        """Launches a batch with grammar rows under overlap -> its output and the last
        batch's (`done`) results: the forward first, then, when the sampler asks for the
        masks, the rest (module docstring)."""
        assert done is not None, "a token in flight, but no batch"
        outputs: list[TokenOutput] = []  # done's, once the sampler has called masks()
        asked = False

        def masks() -> ReadyMasks | None:
            nonlocal asked, outputs
            asked = True
            advance_matchers(done[0].sample_reqs, done[1].tokens())
            self.masks_ahead.start([r.matcher for r in batch.sample_reqs])
            outputs = self.process_results(*done)
            self._book(batch)
            self._next = self.schedule()
            return self.masks_ahead.join()

        out = self.engine.forward_batch(batch, masks)
        assert asked, "the sampler never asked for a constrained batch's masks"
        return out, outputs

    def launch(self, batch: Batch) -> ForwardOutput:
        """Run the batch on the engine (without waiting on CUDA) and book it; the sampler
        fills the masks of grammar rows whose newest token is known (`_launch_constrained`
        for the others)."""
        out = self.engine.forward_batch(batch)
        self._book(batch)
        return out

    def _book(self, batch: Batch) -> None:
        """A launched batch's bookkeeping (see the module docstring)."""
        for req in batch.reqs:
            req.cached_len = req.device_len
        for req in self.prefilling:  # share computed prompt pages with later arrivals
            self.cache.share_prefix(req)
        for req in batch.sample_reqs:
            if req.status is not ReqStatus.RUNNING:
                continue  # finished before it was booked: this token will be dropped
            req.output_ids.append(PENDING_TOKEN)
            if req in self.prefilling:
                self.prefilling.remove(req)
                self.decode.add(req)

    def schedule(self) -> Batch | None:
        retracted = self.decode.retract_until_fits(self.cache, self._retract)
        if retracted:
            logger.warning("KV pool full: retracted %d decoding requests", retracted)
        decodes = next_decodes(self.decode.reqs, self.max_context)  # turns.py
        locs: list[np.ndarray] = []
        for req in decodes:  # their pages were counted by retract_until_fits
            req.device_len = req.total_len
            locs.append(self.cache.extend(req, req.device_len))
        budget = self.budget.prompt_tokens(len(decodes))
        adder = PrefillAdder(budget, self.table, self.cache, len(decodes))
        locs += adder.add_from([*self.prefilling, *self.waiting])
        if not decodes and not adder.added and self.prefilling:
            # Partial prefills hold the whole pool and none can grow: give one back.
            logger.warning("KV pool full of partial prefills: retracting rid %d",
                           self.prefilling[-1].rid)
            self._retract(self.prefilling.pop())
            return self.schedule()
        for req in adder.added:
            if req not in self.prefilling:
                self.waiting.remove(req)
                self.prefilling.append(req)
        reqs = decodes + adder.added
        if not reqs:
            return None
        self.cache.flush_table()
        return build_batch(reqs, locs, self.engine.device)

    def process_results(self, batch: Batch, out: ForwardOutput) -> list[TokenOutput]:
        """Replace each sampling request's PENDING_TOKEN with its token and end the
        finished ones. Requests that ended while the batch was in flight are skipped."""
        outputs = []
        tokens = out.tokens()
        for i, req in enumerate(batch.sample_reqs):
            if req.status in (ReqStatus.FINISHED, ReqStatus.ABORTED):
                continue
            n = first_pending(req.output_ids) + 1  # this token's 1-based position
            token = req.output_ids[n - 1] = tokens[i]
            ended = req.matcher is not None and req.matcher.advance(token, n)
            finish = "stop" if ended else finish_reason(req, token, n, self.eos_ids,
                                                         self.max_context)
            if n == 1:
                self.prompt_tokens += len(req.input_ids)
                self.cached_prompt_tokens += req.prefix_len
            outputs.append(TokenOutput(
                req.rid, token, out.logprobs[i], out.top_logprobs[i], finish, req.prefix_len
            ))
            if finish is not None:
                del req.output_ids[n:]  # a token of the next batch, already launched
                if req.status == ReqStatus.WAITING:  # retracted while in flight
                    self.waiting.remove(req)
                else:
                    self.decode.remove(req)
                self._end(req, ReqStatus.FINISHED)
        return outputs

    def _end(self, req: Req, status: ReqStatus) -> None:
        if req.status == ReqStatus.RUNNING:
            self.cache.release(req)
            self.table.free(req.table_idx)
        req.status, req.table_idx = status, -1
        del self.reqs[req.rid]

    def _retract(self, req: Req) -> None:
        self.cache.release(req)
        self.table.free(req.table_idx)
        req.status, req.table_idx, req.cached_len, req.device_len = ReqStatus.WAITING, -1, 0, 0
        self.waiting.appendleft(req)
