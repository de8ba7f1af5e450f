"""What grammar-constrained decoding costs, through the offline API, with random weights in a
real model's shape:

    python benches/structured.py --model benches/models/qwen3-0.6b --tokenizer DIR

`--requests` (64) requests constrained by a JSON schema (random prompt ids of
`--input-len` tokens, at most `--output-len` output tokens) against as many unconstrained
ones of the same lengths, in four timed runs after a warm-up: the constrained set alone,
an unconstrained set generating the lengths the constrained one did, both kinds together
(the unconstrained half of the same lengths again), and an unconstrained set twice as large
generating the lengths the mixed run did. `--schema long` (the default) has a string field
no output fills: every request runs to `--output-len`, every step at a lexer state
llguidance has not seen (its worst case); `--schema typical` has the fields an extraction
has, and its grammars end where the model closes them. The schema needs a tokenizer with
JSON's punctuation, so the model folder is the shape's config.json beside `--tokenizer
DIR`'s tokenizer.json (the default model's will do: tokens past its vocabulary are masked
for constrained rows). Reported: output tokens/s per run, constrained over unconstrained
(target >= 0.8x), what the mixed run costs the unconstrained half (its time against the
twice as large unconstrained set: target < 5%), the grammar compile time per schema, and
the host time of a constrained step's parts (HostTimer). Writes $OUT/structured.json when
OUT is set."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import Constraint, ConstraintKind, SamplingParams

# The worst case: the long string's `minLength` puts every step at a lexer state llguidance
# has not seen (it counts characters), and no grammar ends before --output-len.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["alpha", "beta", "gamma"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
        "text": {"type": "string", "minLength": 100_000},
    },
    "required": ["name", "tags", "text"],
}
# What an extraction or a tool's arguments look like: its grammars end where the model
# closes the last field (at most --output-len tokens).
TYPICAL = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "kind": {"type": "string", "enum": ["book", "film", "album", "game"]},
        "year": {"type": "integer"},
        "rating": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "summary": {"type": "string"},
    },
    "required": ["title", "kind", "year", "rating", "tags", "summary"],
}
SCHEMAS = {"long": SCHEMA, "typical": TYPICAL}


def model_folder(shape: Path, tokenizer: Path) -> Path:
    out = Path(tempfile.mkdtemp(prefix="structured-model-"))
    config = json.loads((shape / "config.json").read_text())
    # The EOS must be a token of the tokenizer the grammars are built on: its own folder's.
    tok_config = tokenizer / "config.json"
    config["eos_token_id"] = (json.loads(tok_config.read_text())["eos_token_id"]
                              if tok_config.is_file() else 0)
    (out / "config.json").write_text(json.dumps(config))
    shutil.copy(tokenizer / "tokenizer.json", out / "tokenizer.json")
    return out


def requests(n: int, input_len: int, lengths: list[int], seed: int, schema: dict | None,
             ) -> tuple[list[list[int]], list[SamplingParams]]:
    """n requests of random prompt ids; request k generates lengths[k % len(lengths)]
    tokens, or fewer where its grammar ends (schema: constrained by it)."""
    rng = random.Random(seed)
    prompts = [[rng.randint(100, 10000) for _ in range(input_len)] for _ in range(n)]
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema)) if schema else None
    params = [SamplingParams(temperature=1.0, seed=seed + k, ignore_eos=True,
                             max_new_tokens=lengths[k % len(lengths)], constraint=constraint)
              for k in range(n)]
    return prompts, params


class HostTimer:
    """Host milliseconds of a step's parts, per step that has each, in the unconstrained and
    the constrained run. `step`: the scheduler's whole step; `process`, the previous
    batch's results (waiting for its tokens, moving the matchers); `forward`, launching
    the forward; `sample`, the sampler. A constrained step under overlap also has: `start`,
    handing the mask fill to the helper thread; `plan`, what the scheduler's thread does
    meanwhile inside `sample` (the batch's bookkeeping, planning the next batch, then
    `join`, waiting for the helper); `fill`, llguidance computing masks on the helper;
    `refill`, the sampler completing them (rows not filled ahead); `apply`, the float32
    path's masking (the Triton draw applies masks itself). And when, counted from the
    step's start, the fill begins and ends on the helper and the scheduler's thread joins
    it (`fill_begins`, `fill_ends`, `join_begins`). Works on older trees too (A/B), where
    some parts are absent."""

    def __init__(self, llm: LLM) -> None:
        import minisgl_worker.constrain.mask as mask_module
        import minisgl_worker.engine.sampler as sampler_module
        import minisgl_worker.scheduler.scheduler as scheduler_module

        self.active: str | None = None  # the run being timed
        names = ["step", "advance", "process", "start", "forward", "sample", "plan", "join", "fill",
                 "refill", "apply", "fill_begins", "fill_ends", "join_begins"]
        self._step_began = 0.0
        self.names = names
        self.seconds: dict[str, dict[str, float]] = {}  # run -> part -> seconds
        self.steps: dict[str, dict[str, int]] = {}
        scheduler, sampler = llm.scheduler, llm.engine.sampler
        scheduler.step = self._timed("step", scheduler.step)
        scheduler.process_results = self._timed("process", scheduler.process_results)
        if hasattr(scheduler_module, "advance_matchers"):  # trees that move them first
            scheduler_module.advance_matchers = self._timed(
                "advance", scheduler_module.advance_matchers)
        ahead = scheduler.masks_ahead
        ahead.start = self._timed("start", ahead.start)
        ahead.join = self._timed("join", ahead.join)
        sampler.sample = self._timed("sample", sampler.sample)
        for runner in set(llm.engine.runners.values()):
            runner.run = self._timed("forward", runner.run)
        job = getattr(mask_module, "MaskJob", None)
        if job is not None:  # the helper computes a MaskJob
            job.compute = self._timed("fill", job.compute)
        else:  # the helper runs MaskFiller.fill
            ahead._filler.fill = self._timed("fill", ahead._filler.fill)
        sampler._masks.fill = self._timed("refill", sampler._masks.fill)
        sampler_module.apply_bitmask = self._timed("apply", sampler_module.apply_bitmask)
        engine = llm.engine
        forward = engine.forward_batch

        def forward_batch(batch, *callbacks):  # the last one: the masks callback
            *rest, masks = callbacks or (None,)
            return forward(batch, *rest, masks and self._timed("plan", masks))

        engine.forward_batch = forward_batch

    def _timed(self, name, inner):
        def timed(*args):
            if self.active is None or (name == "fill" and threading.current_thread()
                                       is threading.main_thread()):
                return inner(*args)  # not timed (a fill on this thread is a `refill`)
            t = time.perf_counter()
            if name == "step":
                self._step_began = t
            elif name in ("fill", "join"):
                self._add(f"{name}_begins", t - self._step_began)
            result = inner(*args)
            end = time.perf_counter()
            self._add(name, end - t)
            if name == "fill":
                self._add("fill_ends", end - self._step_began)
            return result
        return timed

    def _add(self, name: str, seconds: float) -> None:
        run = self.active
        self.seconds.setdefault(run, dict.fromkeys(self.names, 0.0))[name] += seconds
        self.steps.setdefault(run, dict.fromkeys(self.names, 0))[name] += 1

    def ms_per_step(self, run: str) -> dict[str, float]:
        """Each part's mean over the steps of `run` that have it (absent parts left out)."""
        return {name: round(1e3 * t / self.steps[run][name], 3)
                for name, t in self.seconds.get(run, {}).items() if self.steps[run][name]}


def profile_host(llm: LLM, label: str, prompts: list[list[int]],
                 params: list[SamplingParams]) -> list[int]:
    """The host functions that a run spends its time in (cProfile of the scheduler's
    thread, by own time, then the worker's functions by cumulative time): with a GPU that
    keeps up, a step is as long as its host work."""
    import cProfile
    import pstats

    print(f"== host profile: {label}")
    profiler = cProfile.Profile()
    results = profiler.runcall(llm.generate, prompts, params)
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumtime").print_stats("minisgl_worker", 40)
    return [len(r["token_ids"]) for r in results]


def timed_run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams],
              ) -> tuple[float, float, list[int]]:
    """-> seconds, seconds until the last unconstrained request ended (0 without any), each
    request's output tokens. Only a grammar ends a request early."""
    sched = llm.scheduler
    add, step = sched.add_request, sched.step
    free: set[int] = set()
    free_ended = 0.0

    def added(msg):
        if msg.sampling.constraint is None:
            free.add(msg.rid)
        return add(msg)

    def stepped():
        nonlocal free_ended
        outs = step()
        if any(o.finish and o.rid in free for o in outs):
            free_ended = time.perf_counter()
        return outs

    sched.add_request, sched.step = added, stepped
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    try:
        results = llm.generate(prompts, params)
    finally:
        sched.add_request, sched.step = add, step
    seconds = time.perf_counter() - t
    tokens = [len(r["token_ids"]) for r in results]
    for p, r, k in zip(params, results, tokens):
        assert k == p.max_new_tokens or (p.constraint and r["finish_reason"] == "stop"), \
            "a request ended early"
    return seconds, max(free_ended - t, 0.0), tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b", help="a shape's folder")
    p.add_argument("--tokenizer", required=True, help="a folder with a tokenizer.json")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--schema", choices=sorted(SCHEMAS), default="long",
                   help="long: a string field no output can fill (every request generates "
                   "--output-len tokens); typical: fields an extraction has (grammars end)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: the engine's)")
    p.add_argument("--profile", action="store_true",
                   help="after the timed runs, profile the host during one more constrained and "
                   "one more unconstrained run")
    p.add_argument("--overlap", choices=["on", "off"], default=None,
                   help="force overlap scheduling (default: the scheduler's, on for CUDA)")
    args = p.parse_args()
    folder = model_folder(Path(args.model), Path(args.tokenizer))
    options = {"device": args.device} if args.device else {}
    llm = LLM(folder, load_format="dummy", cache="naive", **options)
    if args.overlap:
        llm.scheduler.overlap = args.overlap == "on"
    n, i, o = args.requests, args.input_len, args.output_len
    schema = SCHEMAS[args.schema]
    # Warm-up: the grammar tokenizer and compile, then a whole unconstrained set (the first
    # run of a batch this size paid ~0.5 s more than the ones after it).
    llm.generate(*requests(4, 16, [8], 3, schema))
    llm.generate(*requests(n, i, [o], 4, None))
    timer = HostTimer(llm)
    seconds, tokens, free_done = {}, {}, {}  # free_done: the last unconstrained one's end

    def run(name: str, reqs: tuple[list[list[int]], list[SamplingParams]]) -> list[int]:
        timer.active = name if name in ("unconstrained", "constrained") else None
        seconds[name], free_ended, lengths = timed_run(llm, *reqs)
        timer.active = None
        tokens[name] = sum(lengths)
        free_done[name] = free_ended
        return lengths

    # Each unconstrained run generates the lengths of the constrained run before it.
    lengths = run("constrained", requests(n, i, [o], 1, schema))
    run("unconstrained", requests(n, i, lengths, 0, None))
    free, bound = requests(n, i, lengths, 2, None), requests(n, i, [o], 5, schema)
    lengths = run("mixed", (free[0] + bound[0], free[1] + bound[1]))
    run("unconstrained x2", requests(2 * n, i, lengths, 6, None))
    if args.profile:
        lengths = profile_host(llm, "constrained", *requests(n, i, [o], 7, schema))
        profile_host(llm, "unconstrained", *requests(n, i, lengths, 8, None))
    grammars = llm.scheduler.grammars  # its tokenizer was built by the warm-up's compile
    before, count = grammars.compile_seconds, grammars.num_compiled
    for k in range(8):  # distinct schemas: each compiles once
        grammars.matcher(Constraint(ConstraintKind.JSON_SCHEMA,
                                    json.dumps({**schema, "title": f"schema {k}"})))
    compile_ms = 1e3 * (grammars.compile_seconds - before) / (grammars.num_compiled - count)
    result = {
        "model": Path(args.model).name, "schema": args.schema, "requests": n,
        "input_len": i, "output_len": o,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "output_tokens": tokens,
        "tok_s": {k: round(tokens[k] / v, 1) for k, v in seconds.items()},
        "constrained_vs_unconstrained": round(seconds["unconstrained"] / seconds["constrained"], 3),
        "mixed_vs_unconstrained_x2": round(seconds["mixed"] / seconds["unconstrained x2"], 3),
        "mixed_free_half_vs_unconstrained_x2": round(
            free_done["mixed"] / seconds["unconstrained x2"], 3),
        "mixed_free_half_s": round(free_done["mixed"], 3),
        "compile_ms_per_schema": round(compile_ms, 2),
        "overlap": llm.scheduler.overlap,
        "host_ms_per_step": {run: timer.ms_per_step(run) for run in timer.seconds},
        "host_steps": timer.steps,
    }
    print(json.dumps(result))
    print("| run | s | output tokens | tok/s |\n| --- | ---: | ---: | ---: |")
    for k, v in seconds.items():
        print(f"| {k} | {v:.3f} | {tokens[k]} | {result['tok_s'][k]:,.0f} |")
    print(f"constrained / unconstrained throughput: {result['constrained_vs_unconstrained']}x; "
          f"mixed / unconstrained x2 time: {result['mixed_vs_unconstrained_x2']}x (its "
          f"unconstrained half: {result['mixed_free_half_vs_unconstrained_x2']}x); compile "
          f"{result['compile_ms_per_schema']} ms a schema; overlap {result['overlap']}")
    for run, parts in result["host_ms_per_step"].items():
        print(f"host ms a step, {run}: {parts}")
    if "OUT" in os.environ:
        Path(os.environ["OUT"], "structured.json").write_text(json.dumps(result) + "\n")
    llm.shutdown()
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
