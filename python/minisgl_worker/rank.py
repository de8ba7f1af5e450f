"""One rank of a worker: its device and threads, its place in the TP group, the engine and
scheduler, then rank 0's loop on the socket (`serve`) or another rank's (`follow`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from .distributed import TPInfo, destroy_distributed, init_distributed
from .distributed.ranks import rank_device, share_cores
from .engine import Engine, EngineConfig, KVMemoryError
from .protocol import Ready
from .scheduler import Scheduler, ZmqIO, follow, serve

if TYPE_CHECKING:
    import torch


def run_rank(args: argparse.Namespace, addr: str | None, rank: int,
             on_shutdown: Callable[[], None] | None = None) -> None:
    """Rank `rank` of a group of `args.tp` (addr: rank 0's HOST:PORT when tp > 1).
    on_shutdown: called when rank 0's loop ends on Shutdown, before its teardown."""
    info = TPInfo(rank, args.tp)
    per_host = args.tp // args.nnodes
    _setup_logging(rank if info.size > 1 else None)
    signal.signal(signal.SIGTERM, _on_sigterm)
    device = rank_device(args.device, rank % per_host, info.size)
    comm = None
    if info.size > 1:
        share_cores(device, per_host)
        assert addr is not None
        comm = init_distributed(info, addr, device)
    try:
        engine = _engine(args, device)
    except KVMemoryError as e:
        if rank % per_host == 0:
            raise  # this host's first rank: main() says it
        print(f"minisgl_worker: error: rank {rank}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    scheduler = Scheduler(
        engine, chunk_size=args.chunk_size, prefix_cache=args.cache,
        policy=None if args.schedule_policy == "auto" else args.schedule_policy,
        mixed_chunk_size=None if args.mixed_chunk_size < 0 else args.mixed_chunk_size,
        mixed_step_tokens=None if args.mixed_step_tokens < 0 else args.mixed_step_tokens,
    )
    try:
        if comm is not None and not info.is_primary:
            follow(scheduler, comm)
            return
        cfg = engine.model_config
        ready = Ready(
            model=engine.model_name, vocab_size=cfg.vocab_size, max_context=engine.max_context,
            kv_capacity=engine.kv_pool.num_slots, eos_token_ids=list(cfg.eos_token_ids),
            page_size=engine.page_size, tp_size=info.size, device=str(engine.device),
        )
        io = ZmqIO(args.listen)
        try:
            serve(scheduler, io, ready, parent_pid=args.parent_pid, comm=comm)
            if on_shutdown is not None:
                on_shutdown()
        finally:
            io.close()
    finally:
        scheduler.shutdown()
        engine.shutdown()
        destroy_distributed()


def _setup_logging(rank: int | None) -> None:
    index = os.environ.get("MINISGL_WORKER_INDEX")
    name = "worker" if index is None else f"worker {index}"
    if rank is not None:
        name += f" rank {rank}"
    logging.basicConfig(
        level=os.environ.get("MINISGL_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"[{name}] %(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # unwinds through `finally`, closing the socket


def _engine(args: argparse.Namespace, device: torch.device) -> Engine:
    return Engine(EngineConfig(
        model_path=args.model, device=str(device), dtype=args.dtype, page_size=args.page_size,
        max_running=args.max_running, kv_tokens=args.kv_tokens, load_format=args.load_format,
        attention_backend=args.attention_backend, chunk_size=args.chunk_size,
        cuda_graph_max_bs=args.cuda_graph_max_bs, cuda_graph_max_tokens=args.cuda_graph_max_tokens,
        gemm=args.gemm, kv_cache_dtype=args.kv_cache_dtype,
    ))
