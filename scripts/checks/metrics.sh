#!/usr/bin/env bash
# `promtool check metrics` (Debian's prometheus package) on the /metrics of a
# switch that has carried NAC traffic: the exposition must parse and lint clean
# as a real Prometheus would scrape it. The service and node names use every
# odd-but-legal character (`.`, `-`, `_`): they go into label values as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v promtool >/dev/null; then
    echo "FAIL metrics.sh: promtool is missing (apt-get install prometheus; listed in scripts/deps/ops.apt)"
    exit 1
fi
source scripts/checks/lib/switch.sh
SERVICE=pos.east-1_a
NODE_IDS="n.1 n-2 n_3"
start_switch
nac_load 2s
curl -sf "http://$ADMIN/metrics" > "$WORK/metrics.txt"
for id in $NODE_IDS; do
    grep -qF "isoswitch_server_requests_total{service=\"$SERVICE\",server=\"$id\"}" "$WORK/metrics.txt" \
        || { echo "FAIL metrics.sh: no request counter for node $id of $SERVICE"; exit 1; }
done
if ! promtool check metrics < "$WORK/metrics.txt"; then
    echo "FAIL metrics.sh: promtool check metrics refused the exposition"
    exit 1
fi
echo "ok metrics.sh: $(grep -vc '^#' "$WORK/metrics.txt") samples pass promtool check metrics"
