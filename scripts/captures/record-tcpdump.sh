#!/usr/bin/env bash
# Records fixtures/captures/pos-tcpdump.pcap: real `tcpdump -i lo` of the POS
# example (examples/pos-nac.toml: the switch on 127.0.0.1:6000 in front of
# three sim nodes on 7001-7003) driven by `isoswitch sim nac` for one second.
# tcpdump sees the bytes in clear: the simulators' test card numbers only.
# Needs root (tcpdump) and the ports above free.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-fixtures/captures/pos-tcpdump.pcap}
command -v tcpdump >/dev/null || { echo "record-tcpdump: tcpdump is not installed (apt-get install tcpdump)" >&2; exit 1; }
cargo build --quiet
bin="${CARGO_TARGET_DIR:-target}/debug/isoswitch"
pids=()
data=$(mktemp -d)   # the switch's data directory, gone at the end
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$data"; }
trap cleanup EXIT
for i in 1 2 3; do
  $bin sim node --listen 127.0.0.1:700$i --spec cup-pos --id 0$i >/dev/null 2>&1 & pids+=($!)
done
$bin run --config examples/pos-nac.toml --data-dir "$data/switch" >/dev/null 2>&1 & pids+=($!)
sleep 2
tcpdump -i lo -w "$out" -U 'tcp port 6000' 2>/dev/null & tcpdump_pid=$!
pids+=($tcpdump_pid)
sleep 1
$bin sim nac --connect 127.0.0.1:6000 --uplinks 2 --terminals 4 --rate 20 --duration 1s
sleep 1
kill -INT $tcpdump_pid
wait $tcpdump_pid 2>/dev/null || true
echo "wrote $out"
