#!/usr/bin/env bash
# The journal as other tools see it: a switch carries NAC traffic and an
# operator drains a node; then sqlite3, not our code, reads the store file:
# one journal row per request the NAC sent, each answered by a node, the PAN
# only as first 6 / last 4 and nowhere in clear in the file, the drain in
# admin_log; and `isoswitch journal report` prints the day's table.
# Fails (never skips) without sqlite3 (scripts/deps/store.apt) or curl.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "FAIL journal.sh: $*"; exit 1; }
for tool in sqlite3 curl python3; do
    command -v "$tool" >/dev/null || fail "$tool is missing (scripts/deps/store.apt)"
done
source scripts/checks/lib/switch.sh
# Off by default (its cost, docs/config.md): on for this switch.
export ISOSWITCH__JOURNAL__ENABLED=true
start_switch
"$BIN" sim nac --connect "$FRONT" --uplinks 2 --terminals 20 --rate 200 --duration 1s --json \
    >"$WORK/nac.json" 2>>"$WORK/nac.log" || fail "the NAC run failed"
SENT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sent"])' "$WORK/nac.json")
AUTH="Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN"
curl -sf -X POST -H "$AUTH" -H "Content-Type: application/json" \
    "http://$ADMIN/api/v1/services/pos/nodes/02/drain" >/dev/null || fail "drain refused"
DB="$WORK/data/isoswitch.db"
q() { sqlite3 -readonly "$DB" "$1"; }
# The writer commits every few ms: wait (bounded) for every row.
for _ in $(seq 100); do
    [ "$(q "SELECT count(*) FROM journal")" -ge "$SENT" ] && \
        [ "$(q "SELECT count(*) FROM admin_log WHERE action = 'drain'")" -ge 1 ] && break
    sleep 0.1
done
[ "$(q "SELECT count(*) FROM journal")" = "$SENT" ] || fail "journal rows $(q "SELECT count(*) FROM journal") != NAC sent $SENT"
[ "$(q "SELECT count(*) FROM journal WHERE answered_by = 'node'")" = "$SENT" ] || fail "not every row answered by a node"
[ "$(q "SELECT count(DISTINCT pan) FROM journal")" = 1 ] || fail "more than one PAN shown"
[ "$(q "SELECT pan FROM journal LIMIT 1")" = "622202*********0123" ] || fail "the PAN is not masked first 6 / last 4"
[ "$(q "SELECT status FROM admin_log WHERE action = 'drain'")" = 200 ] || fail "the drain is not in admin_log"
for f in "$DB" "$DB-wal"; do
    [ -f "$f" ] || continue
    ! grep -qa "6222021234567890123" "$f" || fail "$f holds the PAN in clear"
done
"$BIN" journal report --data-dir "$WORK/data" > "$WORK/report.txt" || fail "journal report failed"
grep -q "^pos " "$WORK/report.txt" || { cat "$WORK/report.txt"; fail "no row for service pos in the report"; }
echo "ok journal.sh: $SENT exchanges journaled and read back with sqlite3, PAN masked, drain recorded"
