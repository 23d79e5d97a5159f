#!/usr/bin/env bash
# The two-instance HA rig (docs/ha.md): keepalived VRRP between two switches in
# network namespaces, UnionPay split 4+4 across them, kill -9 of the master
# under ATM load. Needs root; fails (never skips) without it or its tools.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
    echo "FAIL ha.sh: needs root (network namespaces, keepalived); CI runs as root"
    exit 1
fi
for tool in keepalived ip curl python3; do
    command -v "$tool" >/dev/null || { echo "FAIL ha.sh: $tool is missing (scripts/deps/ha.apt)"; exit 1; }
done
cargo build --locked --quiet
# Stale keepalived PID files naming a live process (this shell), as a
# run killed mid-way or an earlier rig's kill -9 leaves them once the PID
# is reused: the rig must start anyway (it once failed CI here).
work=${HA_WORK:-/tmp/${HA_PREFIX:-isoha}}
mkdir -p "$work"
for f in keepalived-a.pid keepalived-a-vrrp.pid keepalived-b.pid keepalived-b-vrrp.pid; do
    echo $$ >"$work/$f"
done
# The whole run is bounded: every step inside has its own limit too.
if ! timeout 240 scripts/ha-rig.sh test; then
    echo "FAIL ha.sh: scripts/ha-rig.sh test failed (logs in /tmp/isoha)"
    scripts/ha-rig.sh down || true
    exit 1
fi
echo "ok ha.sh"
