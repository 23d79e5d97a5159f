#!/usr/bin/env bash
# System calls per message, the switch against HAProxy, in the many-terminals
# case (issue 24): where the kernel half of the CPU per message goes. Three
# `sim node`s and the load generator on CPU 0, the proxy (one worker thread,
# `nbthread 1`) on CPU 1, `perf stat` counting the proxy's syscall
# tracepoints (counted, not sampled: no event is lost) for 5 s in the middle
# of the load.
#
#   scripts/bench-syscalls.sh [CLIENTS] [RATE]    # default 8000 10000
#
# ISOSWITCH_BIN=<binary> measures that build instead of this tree's production
# build. Needs perf (Debian's linux-perf) and haproxy.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-8000}
rate=${2:-10000}
for tool in perf haproxy; do
    command -v "$tool" >/dev/null || { echo "bench-syscalls.sh: $tool is missing" >&2; exit 1; }
done
source scripts/lib/rig.sh
rig_binary
rig_start
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
base=26900
rig_nodes "$base" cups 0
rig_switch_toml "$base" cups "$clients" 1 >"$work/switch.toml"
{
    printf 'global\n  maxconn %s\n  nbthread 1\n' $((clients + 100))
    printf 'defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n'
    printf 'frontend f\n  bind 127.0.0.1:%s\n  default_backend b\nbackend b\n  balance roundrobin\n' "$base"
    for i in 1 2 3; do printf '  server n%s 127.0.0.1:%s\n' "$i" $((base + i)); done
} >"$work/haproxy.cfg"

events=syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait
events+=,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_readv,syscalls:sys_enter_writev
events+=,syscalls:sys_enter_splice,syscalls:sys_enter_futex,syscalls:sys_enter_madvise

measure() {
    local proxy=$1 pid
    if [ "$proxy" = switch ]; then
        ISOSWITCH_LOG=warn taskset -c 1 "$bin" run --worker-threads 1 --config "$work/switch.toml" \
            --data-dir "$work/data" >/dev/null 2>"$work/switch.log" &
    else
        taskset -c 1 haproxy -f "$work/haproxy.cfg" >/dev/null 2>&1 &
    fi
    pid=$!
    sleep 1.5
    # Clients connect at about 1,000 a second: the window opens once they all have.
    local settle=$((clients / 1000 + 4))
    taskset -c 0 "$bin" load --target 127.0.0.1:$base --spec cups --clients "$clients" --in-flight 1 \
        --rate "$rate" --duration $((settle + 8))s --quiet --json --threads 1 >"$work/load.json" &
    local load=$!
    sleep "$settle"
    perf stat -x, -e "$events" -p "$pid" -- sleep 5 2>"$work/stat.csv" >/dev/null
    wait "$load" || true
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    python3 - "$proxy" "$work/stat.csv" "$work/load.json" <<'PY'
import json, sys
proxy, stat, load = sys.argv[1:]
d = json.load(open(load))
rate = d["answered"] / d["elapsed_s"]
msgs = rate * 5
counts = {}
for line in open(stat):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_") and parts[0].isdigit():
        counts[parts[2].removeprefix("syscalls:sys_enter_")] = int(parts[0])
total = sum(counts.values())
shown = ", ".join(f"{k} {v / msgs:.2f}" for k, v in counts.items() if v)
print(f"{proxy:8} {rate:,.0f} answers/s, {total / msgs:.2f} syscalls per message: {shown}")
PY
}
measure switch
measure haproxy
