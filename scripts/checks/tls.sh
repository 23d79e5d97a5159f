#!/usr/bin/env bash
# Debian's `openssl s_client` against a switch this script starts with mutual
# TLS on its listen front and HTTPS on its admin API
# (scripts/checks/lib/tls_switch.sh): the handshake must negotiate TLS 1.3 by
# default, TLS 1.2 when the client offers only that, and the chain must verify
# against the CA. A client without a certificate is refused and counted. The
# CA and certificates are made by openssl in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v openssl >/dev/null; then
    echo "FAIL tls.sh: openssl is missing (apt-get install openssl; listed in scripts/deps/tls.apt)"
    exit 1
fi
source scripts/checks/lib/tls_switch.sh
cargo build --locked --quiet
BIN="${CARGO_TARGET_DIR:-target}/debug/isoswitch"
WORK=$(mktemp -d)
TLS_PIDS=()
trap 'for p in "${TLS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
tls_pki "$WORK"
tls_switch "$BIN" "$WORK"

# s_client: prints the negotiated protocol and the verification result.
s_client() {
    openssl s_client -connect "$1" -CAfile "$WORK/ca.pem" -verify_return_error -brief "${@:2}" \
        </dev/null 2>&1 || true
}
expect() {
    grep -qF "$2" <<<"$3" || { echo "$3"; echo "FAIL tls.sh: $1: no '$2'"; exit 1; }
}
client=(-cert "$WORK/client.pem" -key "$WORK/client.key")
out=$(s_client "$TLS_FRONT" "${client[@]}")
expect "front" "Protocol version: TLSv1.3" "$out"
expect "front" "Verification: OK" "$out"
grep -E "Protocol|Ciphersuite|Verification" <<<"$out" | sed 's/^/  front: /'
out=$(s_client "$TLS_FRONT" "${client[@]}" -tls1_2)
expect "front, TLS 1.2 only" "Protocol version: TLSv1.2" "$out"
expect "front, TLS 1.2 only" "Verification: OK" "$out"
out=$(s_client "$TLS_ADMIN")
expect "admin" "Protocol version: TLSv1.3" "$out"
expect "admin" "Verification: OK" "$out"
# A client without a certificate: refused, and counted by reason.
s_client "$TLS_FRONT" >/dev/null
metric='isoswitch_tls_handshake_failures_total{service="pos",side="accept",reason="no-certificate"}'
count=0
for _ in $(seq 50); do
    # /metrics over HTTPS, by s_client too.
    count=$(openssl s_client -connect "$TLS_ADMIN" -CAfile "$WORK/ca.pem" -quiet 2>/dev/null \
        <<<$'GET /metrics HTTP/1.1\r\nHost: check\r\nConnection: close\r\n\r\n' \
        | grep -F "$metric" | awk '{print $2}' || true)
    [ "${count:-0}" != "0" ] && break
    sleep 0.1
done
[ "${count:-0}" != "0" ] || { echo "FAIL tls.sh: a client without a certificate was not counted"; exit 1; }
echo "ok tls.sh: openssl s_client negotiates TLSv1.3 (TLSv1.2 when asked) and verifies the chain; a client without a certificate is refused and counted"
