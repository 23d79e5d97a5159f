#!/usr/bin/env bash
# User-space instructions per message of the whole proxy process, the switch
# (journal off: the routing core; and as shipped, journal on) against
# HAProxy, in the same run. The number to cut (issue 45), beside
# scripts/path-ir.sh's in-process count: this one has the runtime, the
# writers, the timers, the journal's hand-off, everything a message costs
# the process in user space.
#
# Counted, not sampled, and not timed: the proxy runs under valgrind's
# callgrind with instrumentation off; once the load has settled it is
# switched on for a fixed window (callgrind_control -i on/off), and the
# instructions counted are divided by the messages answered in it. This VM
# has no hardware counters (`perf stat -e instructions:u` says "not
# supported"), and callgrind's count does not move with the machine's load.
# The rate is low (callgrind runs the proxy some 50x slower): what is
# counted per message is the same at any rate the proxy keeps up with,
# except what batching saves at high rates (more messages per wake-up), so
# compare the three rows of one run, not with numbers at 10k req/s.
#
#   scripts/bench-instructions.sh [CLIENTS] [RATE] [WINDOW_S]   # default 50 100 10
#
# ISOSWITCH_BIN=<binary> measures that build instead of this tree's
# production build. SWITCH_THREADS=--single-thread runs the switch on
# tokio's current-thread runtime instead of one multi-thread worker (what
# the scheduler costs a message). KEEP=<dir> keeps each proxy's callgrind output there,
# for `callgrind_annotate --inclusive=yes` (where the count goes). Needs
# valgrind and haproxy.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-50}
rate=${2:-100}
window=${3:-10}
for tool in valgrind callgrind_control haproxy taskset; do
    command -v "$tool" >/dev/null || { echo "bench-instructions.sh: $tool is missing (apt-get install valgrind haproxy util-linux)" >&2; exit 1; }
done
source scripts/lib/rig.sh
rig_binary
rig_start
base=27900
rig_nodes "$base" cups 0
rig_switch_toml "$base" cups "$clients" 1 >"$work/switch.toml"
cp "$work/switch.toml" "$work/switch-nojournal.toml"
printf '[journal]\nenabled = false\n' >>"$work/switch-nojournal.toml"
{
    printf 'global\n  maxconn %s\n  nbthread 1\n' $((clients + 100))
    printf 'defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n'
    printf 'frontend f\n  bind 127.0.0.1:%s\n  default_backend b\nbackend b\n  balance roundrobin\n' "$base"
    for i in 1 2 3; do printf '  server n%s 127.0.0.1:%s\n' "$i" $((base + i)); done
} >"$work/haproxy.cfg"

# measure NAME: runs that proxy under callgrind, loads it, counts a window.
measure() {
    local name=$1 pid out="$work/callgrind-$1.out"
    local grind=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out")
    case "$name" in
        switch-journal-off)
            ISOSWITCH_LOG=warn taskset -c 1 "${grind[@]}" "$bin" run ${SWITCH_THREADS:---worker-threads 1} \
                --config "$work/switch-nojournal.toml" --data-dir "$work/data-$name" \
                >/dev/null 2>"$work/$name.log" & ;;
        switch-as-shipped)
            ISOSWITCH_LOG=warn taskset -c 1 "${grind[@]}" "$bin" run ${SWITCH_THREADS:---worker-threads 1} \
                --config "$work/switch.toml" --data-dir "$work/data-$name" \
                >/dev/null 2>"$work/$name.log" & ;;
        haproxy)
            taskset -c 1 "${grind[@]}" haproxy -f "$work/haproxy.cfg" >/dev/null 2>"$work/$name.log" & ;;
    esac
    pid=$!
    pids+=("$pid")
    # Under callgrind a start takes seconds: wait for the listener.
    for _ in $(seq 1 600); do
        (exec 3<>/dev/tcp/127.0.0.1/$base) 2>/dev/null && break
        sleep 0.1
    done
    local settle=4
    taskset -c 0 "$bin" load --target 127.0.0.1:$base --spec cups --clients "$clients" --in-flight 1 \
        --rate "$rate" --duration $((settle + window + 2))s --quiet --json --threads 1 >"$work/load-$name.json" &
    local load=$!
    sleep "$settle"
    callgrind_control -i on "$pid" >/dev/null
    sleep "$window"
    callgrind_control -i off "$pid" >/dev/null
    wait "$load" || true
    # The window's count is written now; how the proxy stops is not counted
    # (HAProxy under valgrind does not stop on a signal in any useful time).
    callgrind_control -d "$pid" >/dev/null
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP" && cp "$out"* "$KEEP/"
    fi
    python3 - "$name" "$out" "$work/load-$name.json" "$window" <<'PY'
import json, sys
name, out, load, window = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
d = json.load(open(load))
rate = d["answered"] / d["elapsed_s"]
msgs = rate * window
import glob
total = 0
for path in glob.glob(out + "*"):
    for line in open(path):
        if line.startswith("totals:"):
            total += int(line.split()[1])
lost = d.get("sent", d["answered"]) - d["answered"]
p99 = d["latency_us"]["p99"] / 1000
print(f"{name:19} {rate:8,.0f} answers/s (p99 {p99:,.0f} ms)  {total / msgs:9,.0f} user-space instructions per message"
      f"  ({total:,} in {window:.0f} s; {lost} unanswered)")
PY
}
echo "# scripts/bench-instructions.sh $clients $rate $window (switch: ${SWITCH_THREADS:---worker-threads 1}): $(date -u), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), binary $bin, load average $(cut -d' ' -f1-3 /proc/loadavg)"
measure switch-journal-off
measure switch-as-shipped
measure haproxy
