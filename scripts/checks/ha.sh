#!/usr/bin/env bash
# The HA rig (docs/ha.md) as CI runs it: three switches behind keepalived
# VRRP in network namespaces, UnionPay's 8 links split 3+3+2 across them, a
# PostgreSQL primary with a synchronous hot standby as their shared store;
# kill -9 of the master instance under load (the survivors deliver what it
# owed), then kill -9 of the primary database under load (the standby is
# promoted, every instance reconnects, nothing owed is lost). Needs root;
# fails (never skips) without it or its tools. HA_INSTANCES overrides the
# count; ISOSWITCH_BIN runs a given binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
    echo "FAIL ha.sh: needs root (network namespaces, keepalived); CI runs as root"
    exit 1
fi
for tool in keepalived ip curl python3; do
    command -v "$tool" >/dev/null || { echo "FAIL ha.sh: $tool is missing (scripts/deps/ha.apt)"; exit 1; }
done
[ -n "${ISOSWITCH_BIN:-}" ] || cargo build --locked --quiet
export HA_INSTANCES=${HA_INSTANCES:-3}
# Stale keepalived PID files naming a live process (this shell), as a
# run killed mid-way or an earlier rig's kill -9 leaves them once the PID
# is reused: the rig must start anyway (it once failed CI here).
work=${HA_WORK:-/tmp/${HA_PREFIX:-isoha}}
mkdir -p "$work"
for h in a b c d; do
    echo $$ >"$work/keepalived-$h.pid"
    echo $$ >"$work/keepalived-$h-vrrp.pid"
done
# The whole run is bounded (about 100 s on 2 busy cores): every step inside
# has its own limit too.
start=$(date +%s)
if ! timeout 300 scripts/ha-rig.sh test; then
    echo "FAIL ha.sh: scripts/ha-rig.sh test failed (logs in $work)"
    scripts/ha-rig.sh down || true
    exit 1
fi
echo "ok ha.sh ($HA_INSTANCES instances, $(($(date +%s) - start)) s)"
