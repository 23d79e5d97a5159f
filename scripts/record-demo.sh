#!/usr/bin/env bash
# Records `isoswitch demo` for the README: runs the demo (release build, the
# README's command), captures its screen (stdout and stderr in the order
# written, as a terminal shows them) and renders it as docs/demo.svg with
# scripts/terminal_svg.py. The demo's log file is removed afterwards.
#
#   scripts/record-demo.sh [--seconds N]      # default: the demo's own 15 s
set -euo pipefail
cd "$(dirname "$0")/.."

out=docs/demo.svg
cargo build --release --locked --quiet --bin isoswitch
bin=${CARGO_TARGET_DIR:-target}/release/isoswitch
screen=$(mktemp)
trap 'rm -f "$screen"' EXIT
status=0
"$bin" demo "$@" >"$screen" 2>&1 || status=$?
log=$(sed -n '1s/^switch log: \([^ ]*\).*/\1/p' "$screen")
[ -z "$log" ] || rm -f "$log"
if [ "$status" -ne 0 ]; then
    cat "$screen"
    echo "record-demo.sh: the demo failed (exit status $status); $out not written" >&2
    exit 1
fi
python3 scripts/terminal_svg.py "isoswitch demo${*:+ $*}" <"$screen" >"$out"
echo "record-demo.sh: $out ($(wc -l <"$screen") lines)"
