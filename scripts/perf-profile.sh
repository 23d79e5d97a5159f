#!/usr/bin/env bash
# Where the switch spends its user-space time per message (issue 24 item 2):
# three `sim node`s and the load generator on CPU 0, the switch with one
# worker thread pinned to CPU 1, `perf record -g` on the switch for the
# middle of the load, and the top symbols by self time. Also prints the
# switch's user and system CPU per message from /proc.
#
#   scripts/perf-profile.sh [RATE|max] [DURATION] [SPEC]   # default max 8s cups
#
# RATE `max` is the closed loop (saturation, 50 clients x 4 in flight).
# ISOSWITCH_BIN=<binary> profiles that build instead of this tree's release
# build. The report is kept in target/perf-<date>.txt, perf.data beside it.
# CLIENTS=8000 IN_FLIGHT=1 profiles the many-terminals case (the open-file
# limit is raised for it); SETTLE=12 then waits that many seconds for the
# clients to connect before the window opens (default 1), so give it a
# longer DURATION: CLIENTS=8000 IN_FLIGHT=1 SETTLE=12 scripts/perf-profile.sh 10000 30s
# NO_PERF=1 only measures the CPU per message (perf's own sampling and
# unwinding would be counted as the switch's), for an A/B of two builds:
#   for b in A B A B; do NO_PERF=1 ISOSWITCH_BIN=/tmp/$b scripts/perf-profile.sh 15000 8s; done
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-max}
duration=${2:-8s}
spec=${3:-cups}
command -v perf >/dev/null || { echo "perf-profile.sh: perf is missing (Debian's linux-perf)" >&2; exit 1; }
source scripts/lib/rig.sh
rig_binary
rig_start
tck=$(getconf CLK_TCK)
# Every process here (switch, load) may need a descriptor per client.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
stamp=$(date -u +%Y%m%d-%H%M%S)
out="target/perf-$stamp"

rig_nodes 26800 "$spec" 0
rig_switch_toml 26800 "$spec" "${CLIENTS:-50}" "${IN_FLIGHT:-4}" >"$work/switch.toml"
ISOSWITCH_LOG=warn taskset -c 1 "$bin" run --worker-threads 1 --config "$work/switch.toml" \
    --data-dir "$work/data" >/dev/null 2>"$work/switch.log" &
sw=$!
pids+=($sw)
sleep 1.5

ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
clients=${CLIENTS:-50}
in_flight=${IN_FLIGHT:-4}
load_args=(--target 127.0.0.1:26800 --spec "$spec" --duration "$duration" --quiet --json --threads 1
    --clients "$clients" --in-flight "$in_flight")
if [ "$rate" != max ]; then load_args+=(--rate "$rate"); fi
taskset -c 0 "$bin" load "${load_args[@]}" >"$work/load.json" &
load=$!
settle=${SETTLE:-1}
sleep "$settle"
read -r u0 s0 < <(ticks $sw)
secs=${duration%s}
window=$((secs - settle - 2))
[ "$window" -ge 1 ] || { echo "perf-profile.sh: DURATION must exceed SETTLE + 3 s" >&2; exit 1; }
if [ -n "${NO_PERF:-}" ]; then
    sleep "$window"
else
    perf record -q --call-graph dwarf,16384 -F 1000 -p "$sw" -o "$out.data" -- sleep "$window" 2>/dev/null
fi
read -r u1 s1 < <(ticks $sw)
wait $load || echo "perf-profile.sh: the load generator exited non-zero (see its report)" >&2
answered=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("answered", d.get("received", 0)))' "$work/load.json")
dur_s=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("elapsed_s", d.get("duration_s", 0)))' "$work/load.json")
{
    echo "# perf-profile.sh $rate $duration $spec, $clients clients x $in_flight, $bin ($(date -u), load $(cut -d' ' -f1-3 /proc/loadavg))"
    python3 - "$u0" "$s0" "$u1" "$s1" "$tck" "$answered" "$dur_s" "$window" <<'PY'
import sys
u0, s0, u1, s1, tck, answered, dur, window = map(float, sys.argv[1:])
rate = answered / dur if dur else 0
msgs = rate * window
if msgs:
    print(f"answered {answered:.0f} ({rate:,.0f}/s); in the {window:.0f} s window the switch used "
          f"user {(u1-u0)/tck/msgs*1e6:.2f} us + system {(s1-s0)/tck/msgs*1e6:.2f} us per message "
          "(messages in the window taken at the whole run's average rate)")
PY
    if [ -z "${NO_PERF:-}" ]; then
    echo
    perf report -i "$out.data" --no-children --sort symbol --stdio --percent-limit 0.7 2>/dev/null |
        grep -v '^$' | grep -E '^ +[0-9]' | head -60
    fi
} | tee "$out.txt"
echo "perf-profile.sh: report in $out.txt, data in $out.data" >&2
