#!/usr/bin/env bash
# The router against an instant mock worker: streamed completions/s (512-token prompts,
# 64 tokens each) and the latency it adds at a fixed rate. See router/examples/router_overhead.rs.
# Usage: benches/router_overhead.sh [--connections 32] [--seconds 5] [--rate 500] [--model DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --release --manifest-path router/Cargo.toml --example router_overhead -- "$@"
