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
source scripts/lib/rig.sh
rig_binary
rig_start
rig_nodes "$base" cups
rig_switch_toml "$base" cups "$clients" 1 >"$work/switch.toml"
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
