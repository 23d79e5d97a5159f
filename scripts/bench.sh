#!/usr/bin/env bash
# Benchmarks the switch against the load generator straight to a node and
# against HAProxy in TCP mode, in one run on this machine:
#
#   scripts/bench.sh                     # defaults: 10 s per row, 10k req/s fixed-rate run
#   scripts/bench.sh --duration 3s       # any `isoswitch bench` option
#
# Installs HAProxy from Debian's packages when it is missing (as root, with
# apt-get); without apt the HAProxy row is skipped. The report is printed and
# kept in target/bench-<date>.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v haproxy >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "bench.sh: haproxy is not installed and apt-get is unavailable: the HAProxy row is skipped" >&2
    elif [ "$(id -u)" -ne 0 ]; then
        echo "bench.sh: haproxy is not installed; run as root to install it (apt-get install haproxy): the HAProxy row is skipped" >&2
    else
        echo "bench.sh: installing haproxy from Debian packages" >&2
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }; then
            echo "bench.sh: apt-get could not install haproxy: the HAProxy row is skipped" >&2
        fi
    fi
fi
if command -v haproxy >/dev/null 2>&1; then
    haproxy -v | head -n 1 >&2
fi

cargo build --release --quiet
mkdir -p target
out="target/bench-$(date -u +%Y%m%d-%H%M%S).md"
{
    echo "<!-- $(date -u), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) -->"
    ISOSWITCH_LOG=error cargo run --release --quiet -- bench "$@"
} | tee "$out"
echo "bench.sh: report kept in $out" >&2
