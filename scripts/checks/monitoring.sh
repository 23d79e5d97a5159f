#!/usr/bin/env bash
# The Grafana dashboard (deploy/grafana/isoswitch.json) and the Prometheus
# alert rules (deploy/prometheus/alerts.yml) against the switch itself:
#
# 1. `promtool check rules` on the alert rules, `promtool test rules` on
#    their unit tests (deploy/prometheus/alerts_test.yml: every alert fires
#    on the synthetic series it is for, and not on the others).
# 2. A real scrape: `isoswitch demo` runs every kind of service (POS listen
#    front, UnionPay simplex links, VISA duplex links, ATMs through
#    OneConnect) with nodes and load; its /metrics is read once traffic flows.
#    The demo runs in clear: a second switch with TLS on its front and admin
#    (scripts/checks/lib/tls_switch.sh) adds the TLS metrics to the scrape.
# 3. scripts/checks/lib/promql_names.py: every metric a dashboard panel,
#    dashboard variable or alert queries is in that scrape, with the label
#    names it groups or matches on and the label values it matches literally
#    (state="up", reason="descriptors", ...).
# 4. `promtool check rules` on the dashboard's expressions as recording
#    rules (Grafana's variables replaced): each parses as PromQL.
#
# Needs promtool (Debian's prometheus, scripts/deps/ops.apt), openssl
# (scripts/deps/tls.apt) and PyYAML (scripts/deps/monitoring.pip). Fails, never skips, saying what is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL monitoring.sh: $*"
    exit 1
}

command -v promtool >/dev/null || fail "promtool is missing (apt-get install prometheus; listed in scripts/deps/ops.apt)"
command -v curl >/dev/null || fail "curl is missing (apt-get install curl; listed in scripts/deps/ops.apt)"
command -v openssl >/dev/null || fail "openssl is missing (apt-get install openssl; listed in scripts/deps/tls.apt)"
python3 -c 'import yaml' 2>/dev/null || fail "PyYAML is missing (pip install pyyaml; listed in scripts/deps/monitoring.pip)"

promtool check rules deploy/prometheus/alerts.yml >/dev/null \
    || fail "promtool check rules deploy/prometheus/alerts.yml: $(promtool check rules deploy/prometheus/alerts.yml 2>&1)"
out=$(promtool test rules deploy/prometheus/alerts_test.yml 2>&1) \
    || fail "promtool test rules deploy/prometheus/alerts_test.yml: $out"
echo "ok monitoring.sh: promtool check rules and test rules pass on deploy/prometheus/alerts.yml"

cargo build --locked --quiet
bin=${CARGO_TARGET_DIR:-target}/debug/isoswitch
work=$(mktemp -d)
demo=""
TLS_PIDS=()
cleanup() {
    [ -z "$demo" ] || kill "$demo" 2>/dev/null || true
    for p in "${TLS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    # The demo keeps its log after it ends: this one is ours to remove.
    log=$(sed -n '1s/^switch log: \([^ ]*\).*/\1/p' "$work/demo.out" 2>/dev/null)
    [ -z "$log" ] || rm -f "$log"
    rm -rf "$work"
}
trap cleanup EXIT
"$bin" demo --seconds 6 >"$work/demo.out" 2>&1 &
demo=$!
for _ in $(seq 200); do
    grep -q '^t=  2s' "$work/demo.out" 2>/dev/null && break
    sleep 0.1
done
admin=$(grep -o 'admin API on http://[0-9.:]*' "$work/demo.out" | awk '{print $4}')
[ -n "$admin" ] || fail "the demo did not start: $(cat "$work/demo.out")"
curl -sf "$admin/metrics" >"$work/metrics.txt" || fail "no scrape from the demo's $admin/metrics"
wait "$demo" || fail "the demo failed: $(tail -5 "$work/demo.out")"
demo=""
source scripts/checks/lib/tls_switch.sh
mkdir "$work/tls"
tls_pki "$work/tls"
tls_switch "$bin" "$work/tls" || fail "the TLS switch did not start"
curl -sf --cacert "$work/tls/ca.pem" "https://$TLS_ADMIN/metrics" >>"$work/metrics.txt" \
    || fail "no scrape from the TLS switch's https://$TLS_ADMIN/metrics"

names=$(python3 scripts/checks/lib/promql_names.py "$work/metrics.txt" deploy/grafana/isoswitch.json \
    deploy/prometheus/alerts.yml "$work/dashboard-rules.yml") || fail "$names"
echo "ok monitoring.sh: $names"
parsed=$(promtool check rules "$work/dashboard-rules.yml" 2>&1) \
    || fail "a dashboard expression is not PromQL: $parsed"
echo "ok monitoring.sh: every dashboard expression parses as PromQL ($(grep -o '[0-9]* rules' <<<"$parsed"))"
