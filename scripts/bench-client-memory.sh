#!/usr/bin/env bash
# Memory per client connection: the switch's RSS with N terminals connected,
# one request in flight each, against its RSS idle (issue 24's many-terminals
# case, memory only; `isoswitch bench --scenario clients` measures the whole
# curve against HAProxy).
#
#   scripts/bench-client-memory.sh [CLIENTS] [RATE] [BASE_PORT]   # default 2000 4000 27700
#
# Three `sim node`s, `isoswitch run` with one worker thread (cups, two
# connections per node), `isoswitch load --clients N --in-flight 1`; VmRSS
# read from /proc 5 s into a 6 s load. Needs CLIENTS * 2 + 100 open files.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-2000}
rate=${2:-4000}
base=${3:-27700}
bin=${ISOSWITCH_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet --bin isoswitch
    bin="${CARGO_TARGET_DIR:-target}/release/isoswitch"
fi
work=$(mktemp -d)
pids=()
# Waits for them too: a switch still exiting holds the port the next run
# (an A/B of two builds back to back) must bind.
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
for i in 1 2 3; do
    $bin sim node --listen 127.0.0.1:$((base + i)) --spec cups --id 0$i >/dev/null 2>&1 & pids+=($!)
done
{
    printf '[[service]]\nname = "bench"\nspec = "cups"\n[service.front]\nkind = "listen"\n'
    printf 'listen = "127.0.0.1:%s"\nmax_connections = 20000\nmax_per_source = 20000\n' "$base"
    printf '[service.back]\nconnections_per_node = 2\n[service.back.health]\ncheck = "tcp"\n'
    for i in 1 2 3; do
        printf '[[service.back.node]]\nid = "0%s"\naddress = "127.0.0.1:%s"\n' "$i" $((base + i))
    done
} >"$work/switch.toml"
ISOSWITCH_LOG=warn $bin run --worker-threads 1 --config "$work/switch.toml" --data-dir "$work/data" \
    >/dev/null 2>"$work/switch.log" & sw=$!; pids+=($sw)
sleep 1.5
rss() { awk '/VmRSS/{print $2}' "/proc/$sw/status"; }
idle=$(rss)
$bin load --target 127.0.0.1:$base --spec cups --clients "$clients" --in-flight 1 --rate "$rate" \
    --duration 6s --quiet --json >"$work/load.json" & load=$!
sleep 5
busy=$(rss)
wait $load
python3 - "$work/load.json" "$clients" "$idle" "$busy" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
clients, idle, busy = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"clients {clients}: idle {idle} kB, with the clients {busy} kB, "
      f"{(busy - idle) / clients:.1f} kB per connection; answered {d.get('answered', d.get('received'))}")
PY
