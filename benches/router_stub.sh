#!/usr/bin/env bash
# The router alone, measured from outside by benches/online/online.py: a stub worker that does no
# work (router/examples/stub_worker.rs, its own process), the real `minisgl-router` attached
# to it with --worker, and the load generator at a fixed rate. TTFT and E2E of that run are
# what the router (HTTP, tokenize, route, ZMQ, detokenize, SSE) adds, plus the client's own
# cost. benches/router_overhead.sh measures the same path in one Rust process.
#   benches/router_stub.sh [online.py flags, e.g. --request-rates 500 --num-prompts 2500]
# Defaults: 500 req/s for 5 s (2,500 requests), 512-token prompts of English words, 64
# tokens each (ignore_eos), /v1/completions, the default model's tokenizer; a --flag given
# again later overrides. STUB_PORT / ROUTER_PORT pick the ports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-$("$PY" -c 'from minisgl_worker.default_model import ensure_default_model as e; print(e())')}
STUB_PORT=${STUB_PORT:-5599}
ROUTER_PORT=${ROUTER_PORT:-8199}
cargo build --quiet --release --manifest-path router/Cargo.toml --example stub_worker
target/release/examples/stub_worker --listen "tcp://127.0.0.1:$STUB_PORT" --model "$MODEL" &
stub=$!
"$PY" -m minisgl_worker.router_cli --model "$MODEL" --worker "tcp://127.0.0.1:$STUB_PORT" \
    --port "$ROUTER_PORT" --log-level warn &
router=$!
trap 'kill "$router" "$stub" 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$ROUTER_PORT/health" >/dev/null && break
    sleep 0.2
done
"$PY" benches/online/online.py --base-url "http://127.0.0.1:$ROUTER_PORT" --endpoint /v1/completions \
    --tokenizer "$MODEL" --prompt-kind words --input-len 512 --output-len 64 \
    --request-rates 500 --num-prompts 2500 --warmup 200 --label router+stub "$@"
