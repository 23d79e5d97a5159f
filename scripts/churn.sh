#!/usr/bin/env bash
# Connection churn vs the switch's memory (BENCHMARKS.md, "Memory: connection churn and requests in flight"):
# starts two sim nodes and a release `isoswitch run` on
# examples/atm-oneconnect.toml, then prints VmRSS after each round of
# connect -> 1 request -> close clients.
#
#   scripts/churn.sh [PORT] [ROUNDS] [CLIENTS] [SECONDS]
#   scripts/churn.sh 16000 6 2000 3    # rounds of 2,000 concurrent clients, multiplex front
#   scripts/churn.sh 16001 4 1 12      # sequential churn, oneconnect front
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-16000} rounds=${2:-6} clients=${3:-2000} seconds=${4:-3}
cargo build --profile production --quiet
bin="${CARGO_TARGET_DIR:-target}/production/isoswitch"
pids=()
# The switch's data directory: its own, gone at the end.
data=$(mktemp -d)
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$data"' EXIT
"$bin" sim node --listen 127.0.0.1:17001 --spec cup-pos --id 01 >/dev/null 2>&1 & pids+=($!)
"$bin" sim node --listen 127.0.0.1:17002 --spec cup-pos --id 02 >/dev/null 2>&1 & pids+=($!)
ISOSWITCH_LOG=error "$bin" run --config examples/atm-oneconnect.toml --data-dir "$data/switch" --stats-every 600 >/dev/null 2>&1 & switch=$!
pids+=("$switch")
sleep 1
grep VmRSS "/proc/$switch/status"
for _ in $(seq 1 "$rounds"); do
    "$bin" load --target "127.0.0.1:$port" --spec cup-pos --clients "$clients" \
        --connection-per-request --duration "${seconds}s" --quiet --mix 300 | sed -n 2p | tr '\n' ' '
    grep VmRSS "/proc/$switch/status"
done
