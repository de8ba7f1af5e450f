"""Shared-prefix workload through the offline API: the radix prefix cache vs none.

`groups` x `per_group` requests; the requests of a group share a `prefix_len`-token system
prompt (random token ids), each adds `suffix_len` tokens of its own and generates
`output_len` tokens (ignore_eos). All requests are submitted at once in a seeded shuffled
order, and each cache kind runs the same prompts in a fresh LLM (after one warm-up request).
Reported per kind: wall time, requests/s, prompt tokens/s (prompt tokens served per second,
computed or cached), output tokens/s, and the cached share of the prompt tokens.

    GPU:  python benches/shared_prefix.py --model benches/models/qwen3-0.6b --load-format dummy
    CPU:  python benches/shared_prefix.py --small --repeat 2   (the default model, smaller)

Writes $OUT/shared_prefix.json when OUT is set; prints a markdown table last."""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from minisgl_worker.llm import LLM
from minisgl_worker.protocol import SamplingParams

SMALL = {"groups": 4, "per_group": 4, "prefix_len": 256, "suffix_len": 16, "output_len": 8}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="HF-style folder (default: the embedded default model)")
    p.add_argument("--model-config", help="a config.json alone (use with --load-format dummy)")
    p.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--page-size", type=int, default=0, help="0: the engine's default")
    p.add_argument("--max-running", type=int, default=0)
    p.add_argument("--kv-tokens", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=8192)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--per-group", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--caches", default="radix,naive", help="comma-separated cache kinds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="runs per cache kind; keeps the best")
    p.add_argument("--small", action="store_true", help="CPU quick check: " + str(SMALL))
    args = p.parse_args()
    if args.small:
        for key, value in SMALL.items():
            setattr(args, key, value)
    return args


def model_folder(args: argparse.Namespace, tmp: Path) -> str:
    if args.model_config:
        shutil.copy(args.model_config, tmp / "config.json")
        return str(tmp)
    if args.model:
        return str(args.model)
    from minisgl_worker.default_model import ensure_default_model

    return ensure_default_model()


def make_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    prompts = []
    for _ in range(args.groups):
        prefix = tokens(args.prefix_len)
        prompts += [prefix + tokens(args.suffix_len) for _ in range(args.per_group)]
    rng.shuffle(prompts)
    return prompts


def run_one(args: argparse.Namespace, path: str, cache: str) -> dict[str, Any]:
    llm = LLM(
        path, chunk_size=args.chunk_size, cache=cache, device=args.device, dtype=args.dtype,
        page_size=args.page_size, max_running=args.max_running, kv_tokens=args.kv_tokens,
        load_format=args.load_format,
    )
    try:
        vocab = llm.engine.model_config.vocab_size
        sp = SamplingParams(max_new_tokens=args.output_len, ignore_eos=True)
        llm.generate([[11 + i % (vocab - 20) for i in range(64)]], sp)  # warm-up
        prompts = make_prompts(args, vocab)
        _sync()
        start = time.perf_counter()
        results = llm.generate(prompts, sp)
        _sync()
        wall = time.perf_counter() - start
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = sum(len(r["token_ids"]) for r in results)
    cached = sum(r["cached_tokens"] for r in results)
    return {
        "cache": cache, "requests": len(prompts), "prompt_tokens": prompt_tokens,
        "cached_tokens": cached, "output_tokens": output_tokens, "wall_s": wall,
        "req_per_s": len(prompts) / wall, "prompt_tok_per_s": prompt_tokens / wall,
        "output_tok_per_s": output_tokens / wall,
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r["wall_s"] for r in rows if r["cache"] == "naive"), rows[-1]["wall_s"])
    header = ("| cache | requests | prompt tok | cached | wall s | req/s | prompt tok/s "
              "| output tok/s | speedup |")
    lines = [
        header,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['cache']} | {r['requests']} | {r['prompt_tokens']} "
            f"| {r['cached_tokens'] / r['prompt_tokens']:.1%} | {r['wall_s']:.2f} "
            f"| {r['req_per_s']:.1f} | {r['prompt_tok_per_s']:.0f} "
            f"| {r['output_tok_per_s']:.0f} | {base / r['wall_s']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        path = model_folder(args, Path(tmp))
        rows = [
            min((run_one(args, path, cache) for _ in range(args.repeat)),
                key=lambda r: r["wall_s"])
            for cache in args.caches.split(",")
        ]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    shape = (f"{args.groups} groups x {args.per_group} requests, prefix {args.prefix_len}, "
             f"suffix {args.suffix_len}, output {args.output_len}, page {args.page_size or 'engine default'}, "
             f"best of {args.repeat}")
    if os.environ.get("OUT"):
        out = {"device": device, "commit": commit, "workload": shape, "rows": rows}
        Path(os.environ["OUT"], "shared_prefix.json").write_text(json.dumps(out, indent=1))
    model = Path(args.model_config).stem if args.model_config else Path(path).name
    print(f"device {device}, commit {commit}, {model}: {shape}")
    print(table(rows))


if __name__ == "__main__":
    main()
