#!/usr/bin/env bash
# `dpkg --purge` never deletes what the switch still owes. The package's
# postrm (deploy/debian/postrm) runs on a scratch tree ($DPKG_ROOT) holding a
# real store written by the store's own code (examples/saf_bench):
#
# 1. SAF with pending entries: the purge moves the database and its key file
#    to /var/lib/isoswitch.purged-<timestamp> (0700), says so, and the
#    entries are all there;
# 2. every entry gone: the purge removes the data dir, silently;
# 3. a file it cannot read as a store: kept, saying it could not tell.
#
# scripts/checks/package.sh purges the real package (no store in it). Needs
# sqlite3 (scripts/deps/store.apt). Fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL postrm.sh: $*"
    exit 1
}
command -v sqlite3 >/dev/null || fail "sqlite3 is missing (scripts/deps/store.apt)"

cargo build --locked --quiet --example saf_bench
BIN="$PWD/${CARGO_TARGET_DIR:-target}/debug/examples/saf_bench"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A scratch root with the package's paths; $2: make a store with entries.
tree() {
    local root=$WORK/$1
    mkdir -p "$root/etc/isoswitch" "$root/var/lib/isoswitch"
    echo token >"$root/etc/isoswitch/admin-token"
    echo '{}' >"$root/var/lib/isoswitch/runtime-state.json"
    if [ "$2" = store ]; then
        "$BIN" --data-dir "$root/var/lib/isoswitch" --seconds 0.5 --putters 2 >"$WORK/$1.bench" \
            || fail "saf_bench: $(cat "$WORK/$1.bench")"
    fi
    echo "$root"
}

purge() { DPKG_ROOT=$1 sh deploy/debian/postrm purge 2>"$1.log" || fail "postrm purge on $1: $(cat "$1.log")"; }

# 1. Owed entries: kept.
root=$(tree owed store)
owed=$(sqlite3 "$root/var/lib/isoswitch/isoswitch.db" "SELECT count(*) FROM saf WHERE state = 'pending'")
[ "$owed" -gt 0 ] || fail "saf_bench left no pending entry to keep"
purge "$root"
[ ! -e "$root/var/lib/isoswitch" ] || fail "the purge left /var/lib/isoswitch"
[ ! -e "$root/etc/isoswitch/admin-token" ] || fail "the purge left the admin token"
kept=$(ls -d "$root"/var/lib/isoswitch.purged-* 2>/dev/null || true)
[ -n "$kept" ] && [ -d "$kept" ] || fail "no /var/lib/isoswitch.purged-* directory: $(cat "$root.log")"
[ "$(stat -c %a "$kept")" = 700 ] || fail "$kept has mode $(stat -c %a "$kept"), not 700"
[ -f "$kept/store.key" ] || fail "the key file was not kept with the store (its payloads are sealed with it)"
[ "$(sqlite3 "$kept/isoswitch.db" "SELECT count(*) FROM saf WHERE state = 'pending'")" = "$owed" ] \
    || fail "the kept store does not hold the $owed pending entries"
grep -q "purge kept the store: its store-and-forward queue holds $owed pending or dead entries" "$root.log" \
    || fail "the purge did not say it kept the store: $(cat "$root.log")"
echo "ok postrm.sh: a purge keeps a store owing $owed entries in ${kept#"$root"} and says so"

# 2. Nothing owed: removed, without a word.
root=$(tree settled store)
sqlite3 "$root/var/lib/isoswitch/isoswitch.db" "DELETE FROM saf"
purge "$root"
[ ! -e "$root/var/lib/isoswitch" ] || fail "the purge left /var/lib/isoswitch of a store owing nothing"
! ls -d "$root"/var/lib/isoswitch.purged-* >/dev/null 2>&1 || fail "the purge kept a store that owes nothing"
[ ! -s "$root.log" ] || fail "the purge of a store owing nothing said: $(cat "$root.log")"
echo "ok postrm.sh: a purge removes a store that owes nothing"

# 3. Cannot tell: kept.
root=$(tree unknown none)
echo "not a database" >"$root/var/lib/isoswitch/isoswitch.db"
purge "$root"
ls -d "$root"/var/lib/isoswitch.purged-*/isoswitch.db >/dev/null 2>&1 || fail "the purge deleted a store it could not read"
grep -q "could not be read" "$root.log" || fail "the purge did not say why it kept an unreadable store: $(cat "$root.log")"
echo "ok postrm.sh: a purge keeps a store it cannot read, saying so"
