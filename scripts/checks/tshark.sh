#!/usr/bin/env bash
# Round trip with tshark: tshark must read every fixture capture and every
# capture the switch writes, reassemble each TCP stream, and find in them the
# same number of packets and ISO 8583 messages as `isoswitch decode --pcap`.
#
# tshark reassembles (`-z follow,tcp,raw`); isoswitch only cuts tshark's
# streams into frames (`decode --raw`), so a reassembly that differs shows up
# as a different count. Fails if tshark is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v tshark >/dev/null; then
    echo "tshark check: tshark is not installed (Debian: apt-get install tshark; listed in scripts/deps/capture.apt)" >&2
    exit 1
fi
cargo build --locked --quiet
bin="${CARGO_TARGET_DIR:-target}/debug/isoswitch"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# compare FILE SPEC: packets and messages, tshark vs isoswitch.
compare() {
    local file=$1 spec=$2
    local ours packets_ours messages_ours packets_tshark messages_tshark
    ours=$($bin decode --pcap "$file" --spec "$spec" --json 2>&1 >/dev/null | grep -E '^isoswitch decode: [0-9]+ packets' || true)
    if [ -z "$ours" ]; then
        echo "tshark check: $file: isoswitch decode --pcap failed:" >&2
        $bin decode --pcap "$file" --spec "$spec" --json >/dev/null || true
        return 1
    fi
    packets_ours=$(sed -E 's/.* ([0-9]+) packets.*/\1/' <<<"$ours")
    messages_ours=$(sed -E 's/.* ([0-9]+) messages.*/\1/' <<<"$ours")
    packets_tshark=$(tshark -r "$file" 2>/dev/null | wc -l)
    messages_tshark=$(python3 - "$file" "$spec" "$bin" <<'PY'
import subprocess, sys, tempfile, os
path, spec, isoswitch = sys.argv[1:4]
streams = sorted({int(s) for s in subprocess.run(
    ["tshark", "-r", path, "-T", "fields", "-e", "tcp.stream"],
    capture_output=True, text=True, check=True).stdout.split()})
args = ["tshark", "-r", path, "-q"]
for s in streams:
    args += ["-z", f"follow,tcp,raw,{s}"]
out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
total = 0
def count(hexes):
    data = bytes.fromhex("".join(hexes))
    if not data:
        return 0
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        r = subprocess.run([isoswitch, "decode", "--spec", spec, "--raw", "--json", f.name],
                           capture_output=True, text=True)
        return len([l for l in r.stdout.splitlines() if l.strip()])
    finally:
        os.unlink(f.name)
for block in out.split("Follow: tcp,raw")[1:]:
    a, b = [], []
    for line in block.splitlines():
        if not line or line.startswith(("=", "Filter", "Node")):
            continue
        if line.startswith("\t"):
            b.append(line.strip())
        else:
            a.append(line.strip())
    total += count(a) + count(b)
print(total)
PY
)
    if [ "$packets_ours" != "$packets_tshark" ] || [ "$messages_ours" != "$messages_tshark" ]; then
        echo "tshark check: $file: MISMATCH packets isoswitch $packets_ours tshark $packets_tshark; messages isoswitch $messages_ours tshark $messages_tshark" >&2
        return 1
    fi
    echo "tshark check: $file: $packets_tshark packets, $messages_tshark messages: tshark and isoswitch agree"
}

# Fixtures: file and spec (see fixtures/captures/README.md).
compare fixtures/captures/pos-nac.pcapng cup-pos
compare fixtures/captures/pos-lossy.pcap cup-pos
compare fixtures/captures/pos-tcpdump.pcap cup-pos
compare fixtures/captures/atm-short.pcapng iso87ascii
compare fixtures/captures/unionpay.pcapng cups
compare fixtures/captures/visa.pcapng visa-base1

# A capture written now by the running switch (POS, masked).
cat >"$work/pos.toml" <<TOML
[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "127.0.0.1:26500"
[service.back]
connections_per_node = 2
[service.back.health]
check = "tcp"
[[service.back.node]]
id = "01"
address = "127.0.0.1:26501"
[[service.back.node]]
id = "02"
address = "127.0.0.1:26502"
TOML
$bin sim node --listen 127.0.0.1:26501 --spec cup-pos --id 01 >/dev/null 2>&1 & pids+=($!)
$bin sim node --listen 127.0.0.1:26502 --spec cup-pos --id 02 >/dev/null 2>&1 & pids+=($!)
$bin run --config "$work/pos.toml" --data-dir "$work/data" --capture "$work/cap" >"$work/run.log" 2>&1 & switch=$!
pids+=($switch)
sleep 1
$bin sim nac --connect 127.0.0.1:26500 --uplinks 2 --terminals 20 --rate 200 --duration 2s
kill -INT "$switch"
wait "$switch" || true
shopt -s nullglob
written=("$work"/cap/*.pcapng)
if [ ${#written[@]} -eq 0 ]; then
    echo "tshark check: the switch wrote no capture" >&2
    cat "$work/run.log" >&2
    exit 1
fi
for f in "${written[@]}"; do
    compare "$f" cup-pos
done
echo "tshark check: ok"
