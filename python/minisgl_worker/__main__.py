"""`python -m minisgl_worker --model PATH --listen ADDR`: one worker process."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from .engine import Engine, EngineConfig
from .kvcache import CACHE_KINDS
from .protocol import Ready
from .scheduler import Scheduler, ZmqIO, serve
from .scheduler.budget import POLICIES

logger = logging.getLogger("minisgl_worker")


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


def _step_tokens(text: str) -> int:
    value = int(text)
    if value != 0 and value < 4:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or >= 4; got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minisgl_worker", description=__doc__)
    p.add_argument("--model", required=True, help="HF-style model folder")
    p.add_argument("--listen", required=True, help="ipc:// or tcp:// address to bind")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--page-size", type=_non_negative, default=0,
                   help="tokens per KV page; 0: 16 on CUDA, 1 on CPU")
    p.add_argument(
        "--max-running", type=_non_negative, default=0, help="0: 256 on CUDA, 32 on CPU"
    )
    p.add_argument(
        "--kv-tokens", type=_non_negative, default=0,
        help="KV capacity in tokens; 0: 1 GiB worth on CPU; on CUDA what 90%% of the GPU's "
        "memory leaves after the weights, the largest prefill's activations and CUDA graphs",
    )
    p.add_argument("--chunk-size", type=_positive, default=8192, help="prefill tokens per step")
    p.add_argument(
        "--mixed-chunk-size", type=_non_negative, default=0,
        help="prefill tokens per step beside running decodes; 0: the chunk size",
    )
    p.add_argument(
        "--mixed-step-tokens", type=_step_tokens, default=0,
        help="once N/4 or more requests decode, a step holds at most N tokens, decodes "
        "included (prompt chunks fill the rest; at least N/8 a step); 0: off. 256 with "
        "--schedule-policy lof suits large models' offline batches (benches/RESULTS.md)",
    )
    p.add_argument(
        "--schedule-policy", default="fcfs", choices=list(POLICIES),
        help="queue order: fcfs, or lof (longest max_new_tokens first: shortens a batch "
        "submitted at once; long requests overtake short ones)",
    )
    p.add_argument(
        "--cache", default="radix", choices=list(CACHE_KINDS),
        help="prefix cache: radix (reuse shared prompt prefixes) or naive (none)",
    )
    p.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"])
    p.add_argument(
        "--cuda-graph-max-bs", type=_graph_bs, default=-1,
        help="largest decode batch run as a CUDA graph; -1: 256 on GPUs with >= 80 GiB, "
        "else 128; 0: none",
    )
    p.add_argument(
        "--cuda-graph-max-tokens", type=_graph_tokens, default=-1,
        help="largest batch with prompt tokens (prefill, mixed) run as piecewise CUDA graphs "
        "(FlashInfer, bf16/fp16), besides those of exactly --chunk-size tokens; -1: 512; "
        "0: none",
    )
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "flashinfer"])
    p.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"],
        help="KV cache storage: auto (the model's dtype) or fp8_e4m3 (per-tensor scale, half "
        "the bytes of bf16: about twice the KV tokens; torch-native attention only for now)",
    )
    p.add_argument(
        "--gemm", default="auto", choices=["auto", "cublas"],
        help="GEMM of the bias-free linears: auto (on Hopper in bf16, cuBLAS or CUTLASS with "
        "PDL per shape and batch size, chosen once and kept beside FlashInfer's JIT cache) or "
        "cublas everywhere",
    )
    p.add_argument(
        "--parent-pid", type=_positive, default=None,
        help="exit when this process stops being our parent (the router that spawned us "
        "died without shutting us down)",
    )
    return p.parse_args(argv)


def _setup_logging() -> None:
    index = os.environ.get("MINISGL_WORKER_INDEX")
    prefix = f"[worker {index}] " if index is not None else "[worker] "
    logging.basicConfig(
        level=os.environ.get("MINISGL_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=prefix + "%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # unwinds through `finally`, closing the socket


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    config = EngineConfig(
        model_path=args.model, device=args.device, dtype=args.dtype, page_size=args.page_size,
        max_running=args.max_running, kv_tokens=args.kv_tokens, load_format=args.load_format,
        attention_backend=args.attention_backend, chunk_size=args.chunk_size,
        cuda_graph_max_bs=args.cuda_graph_max_bs, cuda_graph_max_tokens=args.cuda_graph_max_tokens,
        gemm=args.gemm, kv_cache_dtype=args.kv_cache_dtype,
    )
    engine = Engine(config)
    scheduler = Scheduler(
        engine, chunk_size=args.chunk_size, prefix_cache=args.cache,
        policy=args.schedule_policy, mixed_chunk_size=args.mixed_chunk_size or None,
        mixed_step_tokens=args.mixed_step_tokens or None,
    )
    cfg = engine.model_config
    ready = Ready(
        model=engine.model_name, vocab_size=cfg.vocab_size, max_context=engine.max_context,
        kv_capacity=engine.kv_pool.num_slots, eos_token_ids=list(cfg.eos_token_ids),
        page_size=engine.page_size, tp_size=1, device=str(engine.device),
    )
    io = ZmqIO(args.listen)
    try:
        serve(scheduler, io, ready, parent_pid=args.parent_pid)
    finally:
        io.close()
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
