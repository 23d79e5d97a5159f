#!/usr/bin/env bash
# What capture costs the switch: the same fixed-rate load through the switch
# with capture off and on, switch CPU per request from /proc/PID/stat
# (utime + stime over the load), and a check that the capture lost nothing
# (its message count = 4 x the requests: client request and answer, node
# request and answer).
#
#   scripts/bench-capture.sh [RATE] [DURATION] [REPEAT]   # default 10000 10s 3
#
# With ISOSWITCH_BASE=/path/to/an/older/isoswitch, each round also runs that
# build with capture on ("on-base"): a before/after in the same run, on the
# same loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-10000}
duration=${2:-10s}
repeat=${3:-3}
# ISOSWITCH_BIN=<binary> measures that build instead of building this tree.
source scripts/lib/rig.sh
rig_binary
rig_start
tck=$(getconf CLK_TCK)

rig_nodes 26600 cups
rig_switch_toml 26600 cups 50 4 >"$work/bench.toml"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run_once() { # $1 = off|on|on-base
    local args=() capdir="$work/cap-$RANDOM" sbin=$bin
    [ "$1" != off ] && args=(--capture "$capdir")
    [ "$1" = on-base ] && sbin=$ISOSWITCH_BASE
    # A fresh data directory per run (a base build older than --data-dir
    # keeps no state and gets none).
    if $sbin run --help | grep -q -- --data-dir; then
        args+=(--data-dir "$work/data-$RANDOM")
    fi
    ISOSWITCH_LOG=warn $sbin run --config "$work/bench.toml" "${args[@]}" >/dev/null 2>"$work/switch.log" &
    local sw=$!
    sleep 1.5
    local before after
    before=$(cpu_ticks $sw)
    local out
    out=$($bin load --target 127.0.0.1:26600 --spec cups --rate "$rate" --duration "$duration" --quiet --json)
    after=$(cpu_ticks $sw)
    kill -INT $sw; wait $sw || true
    local answered
    answered=$(python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("answered", d.get("received", 0)))' <<<"$out")
    local us
    us=$(python3 -c "print(round(($after-$before)/$tck/$answered*1e6, 2))")
    local note=""
    if [ "$1" != off ]; then
        local messages
        # Files rotate at 64 MiB; each holds whole messages: sum them.
        messages=0
        local f n
        for f in "$capdir"/*.pcapng; do
            n=$($bin decode --pcap "$f" --spec cups --json 2>&1 >/dev/null | sed -nE 's/^isoswitch decode: .* ([0-9]+) messages.*/\1/p' || true)
            messages=$((messages + ${n:-0}))
        done
        local dropped=$(( answered * 4 - messages ))
        note=" capture messages $messages (expected $((answered * 4)), lost $dropped)"
        rm -rf "$capdir"
    fi
    echo "capture $1: answered $answered, switch CPU $us us/request$note"
}

for r in $(seq "$repeat"); do
    run_once off
    [ -n "${ISOSWITCH_BASE:-}" ] && run_once on-base
    run_once on
done
