#!/usr/bin/env bash
# Thread-per-core, bounded from above (issue 24 item 3): does a switch whose
# workers share nothing beat today's runtime, where a worker's clients and
# node links are the runtime's to move between threads?
#
#   scripts/bench-per-core.sh [RATE|max] [DURATION] [REPEAT]   # default 10000 10s 3
#
# RATE `max` is the closed loop: as fast as the answers come back.
#
# Both modes get the same load generator (CLIENTS clients, default 50, 4
# requests in flight each, RATE in all) and the same three `sim node`s,
# nothing pinned:
#
# - `shared`: one switch with two worker threads (tokio's multi-thread
#   runtime, today's default).
# - `per-core`: two switch processes with one worker thread each, half the
#   clients at each, each with its own links to the nodes. Two processes share
#   nothing at all: no correlator, no counters, no allocator, no wakeup
#   across threads. A thread-per-core switch in one process can at best
#   match them, so where they do not beat `shared`, it cannot.
#
# Per mode and round: the switches' CPU (utime + stime from /proc, summed)
# per message answered in the window, and the futex calls per message
# (perf stat on the syscall tracepoint, counted: the cross-thread wakeups
# a shared-nothing design removes). ISOSWITCH_BIN=<binary> measures that
# build instead of this tree's release build. Needs perf for the futex
# count (Debian's linux-perf).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-10000}
duration=${2:-10s}
repeat=${3:-3}
clients=${CLIENTS:-50}
command -v perf >/dev/null || { echo "bench-per-core.sh: perf is missing (Debian's linux-perf)" >&2; exit 1; }
source scripts/lib/rig.sh
rig_binary
rig_start
tck=$(getconf CLK_TCK)
secs=${duration%s}
settle=2
window=$((secs - settle - 2))
[ "$window" -ge 2 ] || { echo "bench-per-core.sh: DURATION must be 6s or more" >&2; exit 1; }
base=27100
rig_nodes "$base" cups
# Two fronts on the same nodes: the second switch listens on BASE+10.
rig_switch_toml "$base" cups "$clients" 4 >"$work/a.toml"
sed "s/^listen = \"127.0.0.1:$base\"/listen = \"127.0.0.1:$((base + 10))\"/" "$work/a.toml" >"$work/b.toml"
grep -q ":$((base + 10))\"" "$work/b.toml" || { echo "bench-per-core.sh: cannot write the second front" >&2; exit 1; }

# switch NAME CONFIG THREADS: starts a switch; its pid goes to `sws`.
switch() {
    ISOSWITCH_LOG=warn "$bin" run --worker-threads "$3" --config "$work/$2" \
        --data-dir "$work/$1.data" >/dev/null 2>"$work/$1.log" &
    sws+=($!)
    pids+=($!)
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

round() { # MODE
    local mode=$1 target
    sws=()
    if [ "$mode" = shared ]; then
        switch one a.toml 2
        target="127.0.0.1:$base"
    else
        switch a a.toml 1
        switch b b.toml 1
        target="127.0.0.1:$base,127.0.0.1:$((base + 10))"
    fi
    sleep 1.5
    # One load generator: the same clients, keys and pacing in both modes;
    # with two targets it spreads its clients over them in turn.
    local pace=()
    [ "$rate" != max ] && pace=(--rate "$rate")
    "$bin" load --target "$target" --spec cups --clients "$clients" --in-flight 4 \
        "${pace[@]}" --duration "$duration" --quiet --json --threads 1 >"$work/load.json" &
    local load=$!
    sleep "$settle"
    local t0=0 t1=0 p futex=0 n perfs=()
    for p in "${sws[@]}"; do t0=$((t0 + $(ticks "$p"))); done
    for p in "${sws[@]}"; do
        perf stat -x, -e syscalls:sys_enter_futex -p "$p" -o "$work/futex.$p" -- sleep "$window" >/dev/null 2>&1 &
        perfs+=($!)
    done
    for p in "${perfs[@]}"; do wait "$p" 2>/dev/null || true; done
    for p in "${sws[@]}"; do t1=$((t1 + $(ticks "$p"))); done
    for p in "${sws[@]}"; do
        n=$(awk -F, '/sys_enter_futex/ {print $1}' "$work/futex.$p")
        futex=$((futex + ${n:-0}))
    done
    wait "$load" || echo "bench-per-core.sh: the load generator exited non-zero" >&2
    for p in "${sws[@]}"; do kill "$p"; done
    for p in "${sws[@]}"; do wait "$p" 2>/dev/null || true; done
    python3 - "$mode" "$t0" "$t1" "$tck" "$window" "$futex" "$work/load.json" <<'PY'
import json, sys
mode, t0, t1, tck, window, futex = sys.argv[1], *map(float, sys.argv[2:7])
d = json.load(open(sys.argv[7]))
rate = d["answered"] / d["elapsed_s"]
msgs = rate * window
print(f"{mode:8} answered {d['answered']} of {d['requests']} ({rate:,.0f}/s), declined {d['declined']}, "
      f"p50 {d['latency_us']['p50']} us, p99 {d['latency_us']['p99']} us: switch CPU "
      f"{(t1 - t0) / tck / msgs * 1e6:.2f} us per message, futex {futex / msgs:.3f} per message")
PY
}

echo "# bench-per-core.sh $rate $duration $repeat, $clients clients, $bin ($(date -u), load $(cut -d' ' -f1-3 /proc/loadavg))"
for _ in $(seq "$repeat"); do
    round shared
    round per-core
done
