#!/usr/bin/env bash
# What TLS costs, measured in one run on this machine: CPU per message of the
# switch with a plain listen front, with TLS, with mutual TLS, and of HAProxy
# in TCP mode plain and terminating TLS on its frontend (`bind ... ssl`), all
# before the same three `sim node`s at the same open-loop rate from
# `isoswitch load` (long connections: the handshakes are a few at the start).
# Then handshakes: the ATM profile (`load --connection-per-request`, a TCP
# connection and a full TLS handshake per request) as fast as it goes, CPU
# per connection of the switch and of HAProxy.
#
#   scripts/bench-tls.sh                    # 10k req/s, 10 s a row
#   RATE=5000 DURATION=5s scripts/bench-tls.sh
#
# CPU is utime + stime of the proxy process (/proc/PID/stat) over the row,
# divided by the answers it carried (a message = a request and its answer).
# As scripts/bench.sh: the proxy on CPU 1 with one thread (the switch's
# `--worker-threads 1`, HAProxy's `nbthread 1`), the load generator and the
# nodes on CPU 0, so that neither proxy's CPU is taken by the other side of
# the rig (unpinned, rows moved by several µs a message between runs).
# Needs openssl (certificates, made in a temp dir) and haproxy (Debian's
# package); fails saying so when one is missing. Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-10000}
DURATION=${DURATION:-10s}
ATM_DURATION=${ATM_DURATION:-5s}
for tool in openssl haproxy python3; do
    command -v "$tool" >/dev/null || { echo "bench-tls.sh: $tool is missing (apt-get install $tool)"; exit 1; }
done
source scripts/checks/lib/tls_switch.sh
# The production profile: what ships is what is measured (Cargo.toml).
cargo build --profile production --locked --quiet
BIN=${CARGO_TARGET_DIR:-target}/production/isoswitch
WORK=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
tls_pki "$WORK"
cat "$WORK/switch.pem" "$WORK/switch.key" > "$WORK/haproxy.pem"
HZ=$(getconf CLK_TCK)

wait_port() {
    for _ in $(seq 200); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench-tls.sh: nothing listens on port $1"; exit 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

NODES=()
for id in 01 02 03; do
    port=$(tls_free_port)
    taskset -c 0 "$BIN" sim node --listen "127.0.0.1:$port" --spec cup-pos --id "$id" 2>>"$WORK/nodes.log" &
    PIDS+=($!)
    NODES+=("127.0.0.1:$port")
done
for n in "${NODES[@]}"; do wait_port "${n##*:}"; done

# switch_config PORT TLS_TABLE
switch_config() {
    printf '[[service]]\nname = "pos"\nspec = "cup-pos"\n[service.front]\nkind = "listen"\nlisten = "127.0.0.1:%s"\n%s\n' "$1" "$2"
    printf '[service.back]\nconnections_per_node = 2\n'
    local i=0
    for n in "${NODES[@]}"; do
        i=$((i + 1))
        printf '[[service.back.node]]\nid = "%02d"\naddress = "%s"\n' "$i" "$n"
    done
}
SERVER_TLS=$(printf '[service.front.tls]\ncert = "%s"\nkey = "%s"\n' "$WORK/switch.pem" "$WORK/switch.key")
MUTUAL_TLS=$(printf '%s\nclient_ca = "%s"\nclient_names = ["nac-check"]\n' "$SERVER_TLS" "$WORK/ca.pem")

# start_proxy KIND PORT: switch-plain, switch-tls, switch-mtls, haproxy, haproxy-ssl; sets PROXY.
start_proxy() {
    local kind=$1 port=$2
    case "$kind" in
        switch-*)
            local table=""
            [ "$kind" = switch-tls ] && table=$SERVER_TLS
            [ "$kind" = switch-mtls ] && table=$MUTUAL_TLS
            switch_config "$port" "$table" > "$WORK/$kind.toml"
            taskset -c 1 "$BIN" run --worker-threads 1 --config "$WORK/$kind.toml" --data-dir "$WORK/$kind.data" 2>"$WORK/$kind.log" &
            ;;
        haproxy*)
            local ssl=""
            [ "$kind" = haproxy-ssl ] && ssl=" ssl crt $WORK/haproxy.pem"
            {
                printf 'global\n  maxconn 4000\n  nbthread 1\n'
                printf 'defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n'
                printf 'frontend f\n  bind 127.0.0.1:%s%s\n  default_backend b\nbackend b\n  balance roundrobin\n' "$port" "$ssl"
                local i=0
                for n in "${NODES[@]}"; do i=$((i + 1)); printf '  server n%s %s\n' "$i" "$n"; done
            } > "$WORK/$kind.cfg"
            taskset -c 1 haproxy -f "$WORK/$kind.cfg" -q -db &
            ;;
    esac
    PROXY=$!
    PIDS+=("$PROXY")
    wait_port "$port"
    # A switch's node links up before the row starts.
    sleep 1
}

# row NAME KIND LOAD_ARGS...: one measured row, printed as a table line.
row() {
    local name=$1 kind=$2
    shift 2
    local port
    port=$(tls_free_port)
    start_proxy "$kind" "$port"
    local before after
    before=$(ticks "$PROXY")
    taskset -c 0 "$BIN" load --target "127.0.0.1:$port" --spec cup-pos --json --quiet --threads 1 "$@" > "$WORK/load.json" || true
    after=$(ticks "$PROXY")
    kill "$PROXY"; wait "$PROXY" 2>/dev/null || true
    python3 - "$name" "$before" "$after" "$HZ" "$WORK/load.json" <<'PY'
import json, sys
name, before, after, hz, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
r = json.loads(open(path).read().strip().splitlines()[-1])
msgs = r["answered"] + r["declined"]
cpu_us = (after - before) / hz * 1e6
per_msg = cpu_us / msgs if msgs else float("nan")
per_conn = cpu_us / r["connects"] if r["connects"] else float("nan")
print(f"| {name} | {r['sent_per_s']:.0f} | {msgs} | {r['timeouts']} | {r['latency_us']['p99'] / 1000:.2f} | "
      f"{per_msg:.1f} | {r['connects_per_s']:.0f} | {per_conn:.0f} |")
PY
}

LONG=(--clients 50 --in-flight 4 --rate "$RATE" --duration "$DURATION")
ATM=(--connection-per-request --clients 16 --duration "$ATM_DURATION")
CA=(--tls-ca "$WORK/ca.pem")
CLIENT=(--tls-cert "$WORK/client.pem" --tls-key "$WORK/client.key")
echo "## TLS cost: $(date -u +%Y-%m-%d), $(nproc) CPUs, $RATE req/s for $DURATION, $(haproxy -v | head -1)"
echo
echo "| row | sent/s | answers | timeouts | p99 ms | CPU µs/msg | connects/s | CPU µs/connect |"
echo "|---|---|---|---|---|---|---|---|"
row "switch, plain" switch-plain "${LONG[@]}"
row "switch, TLS" switch-tls "${LONG[@]}" "${CA[@]}"
row "switch, mutual TLS" switch-mtls "${LONG[@]}" "${CA[@]}" "${CLIENT[@]}"
row "haproxy tcp, plain" haproxy "${LONG[@]}"
row "haproxy tcp, ssl" haproxy-ssl "${LONG[@]}" "${CA[@]}"
row "ATM: switch, plain" switch-plain "${ATM[@]}"
row "ATM: switch, TLS" switch-tls "${ATM[@]}" "${CA[@]}"
row "ATM: haproxy, ssl" haproxy-ssl "${ATM[@]}" "${CA[@]}"
