#!/usr/bin/env bash
# Instructions per request and per response on the switch's in-process path
# (benches/path.rs), counted by callgrind: on a shared, noisy machine a count
# of instructions is steady where a time is not. Inclusive instructions of
# `Rig::request` and `Rig::response` (frame cut, validation, key, pick, F37
# stamp, correlator, queue, writer encode) divided by their calls.
#
#   scripts/path-ir.sh [PAIRS] [DIALECT...]     # default 20000, cups cup-pos visa
#
# PATH_IR_DECLINE=1 sends the requests and answers none: each is declined
# at its deadline (`Rig::expire_all`), and the table gives the instructions
# per decline instead of per response.
# PATH_DUPLICATES=off runs the rig's service without the duplicate check
# (`duplicate_window = "0s"`): the check's cost is the difference.
# PATH_TRAFFIC=fresh sends new STANs each round (new correlation keys, as
# terminals send them) instead of the same STANs with another F7 or F41.
#
# PATH_JOURNAL=1 gives the rig's service a journal, so every exchange also
# builds and queues its journal row (the queue is drained outside the
# counted calls): the row's cost on the message path is the difference.
#
# Needs valgrind (Debian package; installed when missing, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-20000}
shift || true
dialects=("$@")
[ ${#dialects[@]} -eq 0 ] && dialects=(cups cup-pos visa)
if ! command -v valgrind >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "path-ir.sh: valgrind is not installed (apt-get install valgrind)" >&2
        exit 1
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
bin=$(cargo bench --bench path --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "path" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "${PATH_IR_DECLINE:-}" = 1 ]; then
    echo "| dialect | instructions per request | per decline (timeout) | requests |"
else
    echo "| dialect | instructions per request | per response | pairs |"
fi
echo "|---|---:|---:|---:|"
for d in "${dialects[@]}"; do
    PATH_IR_PAIRS=$pairs PATH_IR_DIALECT=$d valgrind --tool=callgrind --callgrind-out-file="$out/cg.$d" \
        "$bin" >/dev/null 2>"$out/log.$d" || { cat "$out/log.$d" >&2; exit 1; }
    callgrind_annotate --inclusive=yes --threshold=100 "$out/cg.$d" 2>/dev/null |
        python3 -c '
import re, sys
pairs, d = int(sys.argv[1]), sys.argv[2]
cost = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+\(.*?\)\s+.*?(isoswitch::link::inproc::Rig::(request|response|expire_all))\b", line)
    if m:
        cost.setdefault(m.group(3), int(m.group(1).replace(",", "")))
# setup() runs 256 pairs before the counted ones.
calls = pairs + 256
req = cost.get("request", 0) / calls
# With PATH_IR_DECLINE=1 the counted requests are declined, not answered.
resp = cost["expire_all"] / pairs if "expire_all" in cost else cost.get("response", 0) / calls
print(f"| {d} | {req:.0f} | {resp:.0f} | {pairs} |")
' "$pairs" "$d"
done
