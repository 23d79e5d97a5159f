#!/usr/bin/env bash
# Benchmarks the switch against the load generator straight to a node and
# against HAProxy in TCP mode, in one run on this machine (`isoswitch bench`,
# src/cli/bench.rs; BENCHMARKS.md explains the rows):
#
#   scripts/bench.sh                       # 10 s per row: saturation, 10k and 30k req/s open loop (~2 min)
#   scripts/bench.sh --duration 3s         # shorter rows
#   scripts/bench.sh --rate 10000 --repeat 3
#   scripts/bench.sh --strace              # + system calls per message: strace -c -f -p, 10 s at 10k req/s
#   scripts/bench.sh --dwell               # + time inside each proxy, on the wire: tcpdump, 3 s each at 10k and 30k req/s (--dwell-rate)
#   scripts/bench.sh --no-pin              # let every process run on every CPU
#   scripts/bench.sh --scenario clients --repeat 2 --dwell 3s   # many terminals: 50..10,000 clients at 10k req/s, plot in target/bench-clients.svg
#
# Rows: (a) direct to one node, (a2) direct to every node, (b) HAProxy, (c)
# the switch as shipped, its journal on, and (cj) the switch with its journal
# off (the routing core): every switch row's label says whether its journal
# is on, and the ratios compare HAProxy with both (`--no-journal-off` leaves
# (cj) out).
#
# Any `isoswitch bench` option passes through (`isoswitch bench --help`).
# Nodes, the switch and HAProxy run as processes of their own; the switch and
# HAProxy (same thread count) on CPUs of their own with taskset, the load
# generator and the nodes on the others.
#
# Installs HAProxy (strace with --strace, tcpdump with --dwell) from Debian's packages when
# missing (as root, with apt-get); without HAProxy its row is skipped. The
# report is printed and kept in target/bench-<date>.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# apt_install TOOL PACKAGE: installs PACKAGE when TOOL is not on the PATH.
apt_install() {
    command -v "$1" >/dev/null 2>&1 && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "bench.sh: $1 is not installed and apt-get is unavailable" >&2
        return 1
    elif [ "$(id -u)" -ne 0 ]; then
        echo "bench.sh: $1 is not installed; run as root to install it (apt-get install $2)" >&2
        return 1
    fi
    echo "bench.sh: installing $2 from Debian packages" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }; then
        echo "bench.sh: apt-get could not install $2" >&2
        return 1
    fi
}

apt_install haproxy haproxy || echo "bench.sh: the HAProxy row is skipped" >&2
if command -v haproxy >/dev/null 2>&1; then
    # sed reads all of it: head would close the pipe early, and pipefail turn
    # haproxy's SIGPIPE into the script's exit.
    haproxy -v | sed -n 1p >&2
fi
for arg in "$@"; do
    case "$arg" in
        --strace | --strace=*)
            apt_install strace strace || { echo "bench.sh: --strace needs strace" >&2; exit 1; } ;;
        --dwell | --dwell=*)
            apt_install tcpdump tcpdump || { echo "bench.sh: --dwell needs tcpdump" >&2; exit 1; } ;;
    esac
done
command -v taskset >/dev/null 2>&1 || echo "bench.sh: taskset (util-linux) not found: nothing is pinned" >&2

# The production profile: what ships is what is measured (Cargo.toml).
cargo build --profile production --quiet
mkdir -p target
out="target/bench-$(date -u +%Y%m%d-%H%M%S).md"
{
    echo "<!-- $(date -u), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), command: scripts/bench.sh $* -->"
    ISOSWITCH_LOG=error "${CARGO_TARGET_DIR:-target}"/production/isoswitch bench "$@"
} | tee "$out"
echo "bench.sh: report kept in $out" >&2
