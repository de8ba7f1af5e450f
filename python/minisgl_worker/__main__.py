"""`python -m minisgl_worker --model PATH --listen ADDR [--tp N]`: one worker, one process
per TP rank (this one is rank 0 and spawns the others; with --nnodes, each host's first
rank is started by hand with --node-rank and spawns that host's others)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .distributed.ranks import LocalRanks, free_addr
from .engine import KVMemoryError
from .kvcache import CACHE_KINDS
from .models import CheckpointError, ModelConfig, ModelConfigError, check_checkpoint
from .rank import run_rank
from .scheduler.budget import POLICIES

logger = logging.getLogger("minisgl_worker")

# The serving loop notices a lost router within a second and shuts the TP group down in order
# (scheduler/loop.py); the watchdog below acts only if the process is still here this long
# after: it was loading the model, capturing CUDA graphs, or stuck.
ORPHAN_GRACE_S = 5.0
PARENT_POLL_S = 0.5


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {value}")
    return value


def _graph_bs(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (auto), 0 (none) or >= 1; got {value}")
    return value


def _graph_tokens(text: str) -> int:
    value = int(text)
    if value not in (-1, 0) and value < 16:
        raise argparse.ArgumentTypeError(f"must be -1, 0 or >= 16; got {value}")
    return value


def _auto_non_negative(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (derived) or >= 0; got {value}")
    return value


def _step_tokens(text: str) -> int:
    value = int(text)
    if value not in (-1, 0) and value < 4:
        raise argparse.ArgumentTypeError(f"must be -1 (derived), 0 (off) or >= 4; got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minisgl_worker", description=__doc__)
    for add in (_model_args, _memory_args, _scheduling_args, _kernel_args, _distributed_args):
        add(p)
    args = p.parse_args(argv)
    _check(p, args)
    return args


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving", "What to serve, where and on what.")
    g.add_argument("--model", required=True, help="HF-style model folder")
    g.add_argument("--listen", help="ipc:// or tcp:// address to bind (node 0 only)")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"])
    g.add_argument(
        "--parent-pid", type=_positive, default=None,
        help="exit when this process stops being our parent (the router that spawned us "
        "died without shutting us down)",
    )


def _memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV cache", "How the KV cache is laid out and sized.")
    g.add_argument("--page-size", type=_non_negative, default=0,
                   help="tokens per KV page; 0: 16")
    g.add_argument(
        "--kv-tokens", type=_non_negative, default=0,
        help="KV capacity in tokens; 0: 1 GiB worth on CPU; on CUDA what 90%% of the GPU's "
        "memory leaves after the weights, the largest prefill's activations and CUDA graphs",
    )
    g.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"],
        help="KV cache storage: auto (the model's dtype) or fp8_e4m3 (a scale per layer for K "
        "and V, half the bytes of bf16: about twice the KV tokens; every attention backend)",
    )
    g.add_argument(
        "--cache", default="radix", choices=list(CACHE_KINDS),
        help="prefix cache: radix (reuse shared prompt prefixes) or naive (none)",
    )


def _scheduling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduling", "What a step holds.")
    g.add_argument(
        "--max-running", type=_non_negative, default=0, help="0: 256 on CUDA, 32 on CPU"
    )
    g.add_argument("--chunk-size", type=_positive, default=8192, help="prefill tokens per step")
    g.add_argument(
        "--mixed-chunk-size", type=_auto_non_negative, default=-1,
        help="prefill tokens per step beside running decodes; 0: the chunk size; -1: derived "
        "from the model and the GPU so a step's prompt work fits a 50 ms inter-token latency "
        "(scheduler/budget.py; the whole chunk on CPU)",
    )
    g.add_argument(
        "--mixed-step-tokens", type=_step_tokens, default=-1,
        help="once N/4 or more requests decode, a step holds at most N tokens, decodes "
        "included (prompt chunks fill the rest; at least N/8 a step); 0: off; -1: derived "
        "(off when serving). 256 with --schedule-policy lof suits large models' offline "
        "batches (benches/RESULTS.md)",
    )
    g.add_argument(
        "--schedule-policy", default="auto", choices=["auto", *POLICIES],
        help="queue order: fcfs; lof (longest max_new_tokens first: shortens a batch "
        "submitted at once; long requests overtake short ones); or spf (shortest prompt "
        "first, passed over only by prompts arriving soon after); auto: spf when serving "
        "on a GPU, else fcfs (budget.py)",
    )


def _kernel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernels", "Which kernels run a step.")
    g.add_argument(
        "--cuda-graph-max-bs", type=_graph_bs, default=-1,
        help="largest decode batch run as a CUDA graph; -1: 256 on GPUs with >= 80 GiB, "
        "else 128; 0: none",
    )
    g.add_argument(
        "--cuda-graph-max-tokens", type=_graph_tokens, default=-1,
        help="largest batch with prompt tokens (prefill, mixed) run as piecewise CUDA graphs "
        "(FlashInfer, bf16/fp16), besides those of exactly --chunk-size tokens; -1: 512; "
        "0: none",
    )
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "flashinfer"])
    g.add_argument(
        "--gemm", default="auto", choices=["auto", "cublas"],
        help="GEMM of the bias-free linears: auto (on Hopper in bf16, cuBLAS or CUTLASS with "
        "PDL per shape and batch size, chosen once and kept beside FlashInfer's JIT cache) or "
        "cublas everywhere",
    )


def _distributed_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tensor parallelism", "The ranks of this worker.")
    g.add_argument("--tp", type=_positive, default=1,
                   help="tensor-parallel ranks of this worker (processes; GPUs 0..tp-1 of "
                   "CUDA_VISIBLE_DEVICES on CUDA, the cores shared on CPU)")
    g.add_argument("--nnodes", type=_positive, default=1,
                   help="hosts the TP group spans (tp / nnodes ranks on each)")
    g.add_argument("--node-rank", type=_non_negative, default=0,
                   help="this host's index in the group; node 0 holds rank 0 and --listen")
    g.add_argument("--dist-init-addr", metavar="HOST:PORT", default=None,
                   help="where rank 0 meets the other ranks (needed with --nnodes > 1; "
                   "default: a free local port)")


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.tp % args.nnodes:
        p.error(f"--tp {args.tp} must be a multiple of --nnodes {args.nnodes} (the same "
                "number of ranks on every host)")
    if args.node_rank >= args.nnodes:
        p.error(f"--node-rank must be < --nnodes {args.nnodes}; got {args.node_rank}")
    if args.nnodes > 1 and args.dist_init_addr is None:
        p.error("--nnodes > 1 needs --dist-init-addr HOST:PORT (where node 0's rank 0 listens)")
    if args.node_rank == 0 and args.listen is None:
        p.error("--listen is required on node 0 (rank 0 owns the socket)")
    if args.tp > 1 and args.device.startswith("cuda:"):
        p.error(f"--device {args.device} names one GPU; with --tp {args.tp} give cuda (rank r "
                "of a host takes its GPU r: choose them with CUDA_VISIBLE_DEVICES)")


def _exit_when_orphaned(parent_pid: int) -> None:
    """From a daemon thread: once `parent_pid` is no longer our parent (the router was killed
    outright and could not send Shutdown) and the loop has not ended the process within
    ORPHAN_GRACE_S, SIGTERM ourselves: the main thread unwinds through its `finally`s (the
    socket file is removed, the other ranks stopped) instead of holding the GPU forever."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        time.sleep(ORPHAN_GRACE_S)
        logger.error("the router (pid %d) is gone: exiting before serving", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # a model we cannot serve, or a KV cache that does not fit: one line, no traceback
        cfg = ModelConfig.from_hf(args.model)  # before any rank starts
        if args.load_format == "safetensors":
            check_checkpoint(Path(args.model), cfg)
        if args.parent_pid is not None:
            _exit_when_orphaned(args.parent_pid)
        run_ranks(args)
    except (ModelConfigError, CheckpointError, KVMemoryError) as e:
        print(f"minisgl_worker: error: {e}", file=sys.stderr)
        return 2
    return 0


def run_ranks(args: argparse.Namespace) -> None:
    """This host's ranks: this process is the first; the others are spawned."""
    if args.tp == 1:
        run_rank(args, None, 0)
        return
    per_host = args.tp // args.nnodes
    first = args.node_rank * per_host
    addr = args.dist_init_addr or free_addr()
    ranks = LocalRanks(run_rank, (args, addr), range(first + 1, first + per_host))
    ranks.start()
    try:
        run_rank(args, addr, first, on_shutdown=ranks.expect_exits)
    except BaseException:
        ranks.stop(grace_s=0)  # they may be blocked in a collective with us
        raise
    ranks.stop(grace_s=10)  # they got Shutdown

if __name__ == "__main__":
    sys.exit(main())
