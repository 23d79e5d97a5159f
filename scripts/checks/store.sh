#!/usr/bin/env bash
# The store as other tools see it: examples/saf_bench puts entries for a
# second into a SQLite file and into a throwaway PostgreSQL
# (scripts/pg-test.sh), then sqlite3 and psql, not our code, check what is
# there: exactly the acknowledged entries, an intact WAL-mode file with mode
# 0600 in a 0700 directory, the schema version the source declares
# (src/store/schema.rs), and no more of a PAN than its
# first 6 and last 4 digits in the listing column, and no payload that is
# not sealed (AES-256-GCM, src/store/seal.rs). Fails (never skips)
# without sqlite3, psql or PostgreSQL (scripts/deps/store.apt).
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "FAIL store.sh: $*"; exit 1; }
for tool in sqlite3 psql stat; do
    command -v "$tool" >/dev/null || fail "$tool is missing (scripts/deps/store.apt)"
done

cargo build --locked --quiet --example saf_bench
BIN="$PWD/${CARGO_TARGET_DIR:-target}/debug/examples/saf_bench"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The version both backends must be at: what this build writes.
schema=$(sed -n 's/^pub const SCHEMA_VERSION: i64 = \([0-9]*\);.*/\1/p' src/store/schema.rs)
[ -n "$schema" ] || fail "no SCHEMA_VERSION in src/store/schema.rs"

acked_of() { sed -n 's/.* acked=\([0-9]*\) .*/\1/p' <<<"$1"; }

# The listing column may show 10 digits of a PAN at most.
check_pans() {
    local longest
    longest=$(tr -cd '0-9\n' <<<"$1" | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')
    [ "$longest" -le 10 ] || fail "$2: pan_masked shows $longest digits"
}

# SQLite
out=$("$BIN" --data-dir "$WORK/data" --seconds 1 --putters 8)
acked=$(acked_of "$out")
db="$WORK/data/isoswitch.db"
[ -n "$acked" ] && [ "$acked" -gt 0 ] || fail "sqlite: no entries acknowledged: $out"
[ "$(stat -c %a "$db")" = 600 ] || fail "sqlite: $db has mode $(stat -c %a "$db"), not 600"
[ "$(stat -c %a "$WORK/data")" = 700 ] || fail "sqlite: the data dir has mode $(stat -c %a "$WORK/data"), not 700"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok ] || fail "sqlite: integrity_check"
[ "$(sqlite3 "$db" 'PRAGMA journal_mode')" = wal ] || fail "sqlite: not in WAL mode"
[ "$(sqlite3 "$db" "SELECT value FROM meta WHERE key = 'schema_version'")" = "$schema" ] || fail "sqlite: schema_version is not $schema"
count=$(sqlite3 "$db" "SELECT count(*) FROM saf WHERE state = 'pending'")
[ "$count" = "$acked" ] || fail "sqlite: $acked entries acknowledged, $count stored"
check_pans "$(sqlite3 "$db" 'SELECT DISTINCT pan_masked FROM saf')" sqlite
# Every payload carries the PAN 6234567890121234: sealed, none shows it.
clear=$(sqlite3 "$db" "SELECT count(*) FROM saf WHERE instr(payload, CAST('6234567890121234' AS BLOB)) > 0")
[ "$clear" = 0 ] || fail "sqlite: $clear payloads hold the PAN in clear"
sealed=$(sqlite3 "$db" "SELECT count(*) FROM saf WHERE substr(payload, 1, 4) = X'49535701'")
[ "$sealed" = "$count" ] || fail "sqlite: $sealed of $count payloads sealed"
[ "$(stat -c %a "$WORK/data/store.key")" = 600 ] || fail "sqlite: the key file is not 0600"
echo "ok store.sh sqlite: $acked acknowledged, $count in the file, every payload sealed"

# PostgreSQL
export BIN
scripts/pg-test.sh run -- bash -c '
    set -euo pipefail
    # The server takes TLS only: the bench via ISOSWITCH_TEST_PG_CA, psql
    # verifying the same CA and the host name.
    out=$("$BIN" --url "$ISOSWITCH_TEST_PG_URL" --seconds 1 --putters 8)
    psql() { command psql "$ISOSWITCH_TEST_PG_URL?sslmode=verify-full&sslrootcert=$ISOSWITCH_TEST_PG_CA" "$@"; }
    echo "acked=$(sed -n "s/.* acked=\([0-9]*\) .*/\1/p" <<<"$out")"
    echo "count=$(psql -Atc "SELECT count(*) FROM saf WHERE state = '"'"'pending'"'"'")"
    echo "version=$(psql -Atc "SELECT value FROM meta WHERE key = '"'"'schema_version'"'"'")"
    echo "pans=$(psql -Atc "SELECT string_agg(DISTINCT pan_masked, '"'"' '"'"') FROM saf")"
    echo "clear=$(psql -Atc "SELECT count(*) FROM saf WHERE position(convert_to('"'"'6234567890121234'"'"', '"'"'UTF8'"'"') in payload) > 0")"
    echo "sealed=$(psql -Atc "SELECT count(*) FROM saf WHERE substring(payload from 1 for 4) = '"'"'\x49535701'"'"'::bytea")"
' > "$WORK/pg.out" || fail "postgres: $(cat "$WORK/pg.out")"
value() { sed -n "s/^$1=//p" "$WORK/pg.out"; }
acked=$(value acked)
count=$(value count)
[ -n "$acked" ] && [ "$acked" -gt 0 ] || fail "postgres: no entries acknowledged: $(cat "$WORK/pg.out")"
[ "$count" = "$acked" ] || fail "postgres: $acked entries acknowledged, $count stored"
[ "$(value version)" = "$schema" ] || fail "postgres: schema_version is not $schema"
check_pans "$(value pans | tr ' ' '\n')" postgres
[ "$(value clear)" = 0 ] || fail "postgres: $(value clear) payloads hold the PAN in clear"
[ "$(value sealed)" = "$count" ] || fail "postgres: $(value sealed) of $count payloads sealed"
echo "ok store.sh postgres: $acked acknowledged, $count in the table, every payload sealed"
