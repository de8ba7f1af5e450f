"""What several benches share: mini-sglang's offline workload, the offline API's per-run
set-up, a CUDA-graph capture for kernel micro-benchmarks, and a router started as a
subprocess (benches/routing.py, benches/online/soak.py).

`draw` and `workload_step` are plain Python and nothing here imports the worker at module
level, so benches/minisgl_offline.py imports this file into mini-sglang's process without
our package. Kernel benches in benches/kernels/ put this folder on sys.path first."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from minisgl_worker.llm import LLM
    from minisgl_worker.protocol import SamplingParams


def draw(n: int = 256, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """mini-sglang's offline workload (its benchmark/offline/bench.py) in its draw order ->
    (prompts, output lengths): n prompts of random token ids in [0, 10000], lengths uniform
    in [100, 1024], then n output lengths uniform in [100, 1024]. (`random.seed(seed)` with
    the module functions, as mini-sglang's script, gives the same numbers.)"""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(n)]
    return prompts, [rng.randint(100, 1024) for _ in range(n)]


def workload_step(step: int) -> list[int]:
    """KV lengths of the workload's running requests at decode step `step` (all prompts
    taken as prefilled together): those with more than `step` output tokens."""
    prompts, outs = draw()
    return [len(p) + step for p, o in zip(prompts, outs) if o > step]


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """`draw`'s requests as our offline API takes them: ignore_eos, temperature 0.6."""
    from minisgl_worker.protocol import SamplingParams

    prompts, output_lens = draw(n, seed)
    return prompts, [SamplingParams(temperature=0.6, ignore_eos=True, max_new_tokens=m)
                     for m in output_lens]


def mixed_graph_option(tokens: int | None) -> dict[str, int]:
    """LLM(...)'s option for --mixed-graph-tokens (None: the engine's default)."""
    return {} if tokens is None else {"cuda_graph_mixed_tokens": tokens}


def drop_prefix_cache(llm: LLM) -> None:
    """Evict every cached prefix: a repetition of the same prompts would otherwise skip
    their prefill (mini-sglang's side runs each repetition cold, in a fresh process)."""
    llm.drop_prefix_cache()


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`fn`'s kernels as one CUDA graph, after a warm-up call outside the capture (cuBLAS
    workspaces, Triton compiles). The caller keeps `fn`'s buffers alive with the graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return graph


def launch_router(args: list[str], log: Path, timeout_s: float,
                  env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`minisgl-router --port FREE ARGS` (its output to `log`) -> (process, base URL), once
    `/health` answers 200; SystemExit naming the log if it exits or is not ready in time.
    Where the package is on PYTHONPATH rather than installed (the GPU machine), its module."""
    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "minisgl-router"
    launch = [str(exe)] if exe.exists() else [sys.executable, "-m", "minisgl_worker.router_cli"]
    proc = subprocess.Popen([*launch, "--port", str(port), *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"router exited {proc.returncode}; see {log}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit(f"router not ready after {timeout_s:.0f} s; see {log}")
