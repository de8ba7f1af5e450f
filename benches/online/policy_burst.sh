#!/usr/bin/env bash
# A burst of requests (all at once) through the router and one attached worker, once per
# queue policy, on the real default model on CPU: how the order moves time to first token.
#   bash benches/online/policy_burst.sh            (POLICIES="fcfs spf" N=48 IN=256 OUTLEN=8)
# Prompts are random token ids of IN x [0.1, 1.9] tokens; results append to $OUT/online.jsonl.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/policy-burst}
PORT=${PORT:-7300}
MODEL=$($PY -c 'from minisgl_worker.default_model import ensure_default_model as m; print(m())')
export PYTHONPATH=$PWD/python
mkdir -p "$OUT"
for policy in ${POLICIES:-fcfs spf}; do
    setsid bash -c "$PY -m minisgl_worker --model $MODEL --device cpu \
        --listen tcp://127.0.0.1:$((PORT + 1)) --schedule-policy $policy & \
        $PY -m minisgl_worker.router_cli --model $MODEL --worker tcp://127.0.0.1:$((PORT + 1)) \
        --port $PORT --log-level warn & wait" >"$OUT/server-$policy.log" 2>&1 &
    pgid=$!
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 1; done
    $PY benches/online/online.py --base-url "http://127.0.0.1:$PORT" --endpoint /v1/completions \
        --tokenizer "$MODEL" --dataset random --input-len "${IN:-256}" --output-len "${OUTLEN:-8}" \
        --range-ratio 0.9 --request-rates inf --num-prompts "${N:-48}" --warmup 4 \
        --client-procs 1 --label "$policy" --json "$OUT/online.jsonl" | grep -vE "^\s*$"
    kill -TERM -- "-$pgid"
    sleep 3
    kill -KILL -- "-$pgid" 2>/dev/null
done
