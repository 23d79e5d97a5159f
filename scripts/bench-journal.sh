#!/usr/bin/env bash
# What the journal costs the switch: the same fixed-rate load through the
# switch with `[journal] enabled = false` and `true`, alternated round by
# round, switch CPU per request from /proc/PID/stat (utime + stime over the
# load), and a check that the journal lost nothing (its rows, read with
# sqlite3 after the switch stopped, = requests answered; its dropped count).
#
#   scripts/bench-journal.sh [RATE] [DURATION] [REPEAT]   # default 10000 10s 3
#
# The load varies F37 and F41 (`load --vary-keys`: a terminal per client, an
# RRN per request), so the journal's indexes see real keys; SAME_KEYS=1
# sends the template's on every request, as runs before Dec 4 did.
# ISOSWITCH_BIN=<binary> measures that build instead of building this tree;
# JOURNAL_TOML='batch_interval = "50ms"' adds keys to the `[journal]` table;
# PREFILL=N starts each journal-on round on a journal that already holds N
# rows (random keys, written with sqlite3 into the schema this build
# creates), as a switch that has run for a while does; SQLite only.
# MODES="off on built bare" adds, each round and in that order, two
# journals that bound what the journal can cost (default MODES="off on"):
# `built` is the journal with a queue of one row, so the message path
# builds every row and the full queue drops nearly all of them (the
# message path's share alone, whatever the store); `bare` is the journal
# as this build makes it with its indexes dropped (SQLite only: the
# table's own b-tree, the least a queryable row costs the store). Each
# round also shows the store's writer thread's own CPU (its schedstat),
# the rest being the message path's; the last lines give each mode's
# medians, its median ratio to the same round's `off`, and the median of
# what it adds besides the store thread (the message path's share, as
# noisy as the whole: it is a difference of two rounds' totals).
# JOURNAL_PG_URL=postgres://... stores on that PostgreSQL instead of SQLite
# (in both modes, so off pays for the same store; rows counted with psql):
#   scripts/pg-test.sh run -- bash -c 'JOURNAL_PG_URL=$ISOSWITCH_TEST_PG_URL scripts/bench-journal.sh'
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-10000}
duration=${2:-10s}
repeat=${3:-3}
pg=${JOURNAL_PG_URL:-}
if [ -n "$pg" ]; then
    command -v psql >/dev/null || { echo "bench-journal.sh: psql is missing (scripts/deps/store.apt)" >&2; exit 1; }
else
    command -v sqlite3 >/dev/null || { echo "bench-journal.sh: sqlite3 is missing (scripts/deps/store.apt)" >&2; exit 1; }
fi
source scripts/lib/rig.sh
rig_binary
rig_start
tck=$(getconf CLK_TCK)

rig_nodes 26700 cups
config() { # $1 = true|false
    if [ -n "$pg" ]; then printf '[store]\nurl = "%s"\nkey_file = "%s"\nca_file = "%s"\n' "$pg" "$work/store.key" "${ISOSWITCH_TEST_PG_CA:?the test server takes TLS only: run under scripts/pg-test.sh run}"; fi
    printf '[journal]\nenabled = %s\n%s\n' "$1" "${JOURNAL_TOML:-}"
    rig_switch_toml 26700 cups 50 4
}
# A PostgreSQL store needs a key file: the bench makes one.
(umask 077; printf '1 %s\n' "$(python3 -c 'import secrets; print(secrets.token_hex(32))')" >"$work/store.key")
config false >"$work/off.toml"
config true >"$work/on.toml"
JOURNAL_TOML="${JOURNAL_TOML:-}"$'\nqueue = 1' config true >"$work/built.toml"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The store's writer thread's CPU time in ns (its schedstat, finer than the
# ticks of stat): what the store costs, apart from the message path's share.
store_ns() {
    local t
    for t in /proc/"$1"/task/*; do
        if [ "$(cat "$t/comm" 2>/dev/null)" = isoswitch-store ]; then
            awk '{print $1}' "$t/schedstat"
            return
        fi
    done
    echo 0
}

journal_rows() { # $1 = data directory
    if [ -n "$pg" ]; then
        psql "$pg" -Atc "SELECT count(*) FROM journal" 2>/dev/null || echo 0
    else
        sqlite3 -readonly "$1/isoswitch.db" "SELECT count(*) FROM journal"
    fi
}

# The file a round of MODE starts on: the schema as this build makes it
# (a switch started once on an empty directory), then PREFILL rows in one
# transaction, parted as the switch parts them where the schema has parts,
# then MODE's change to the journal. Echoes the file.
prefill=${PREFILL:-0}
modes=${MODES:-off on}
template() { # $1 = on|bare
    local data="$work/template-$1"
    ISOSWITCH_LOG=warn $bin run --config "$work/on.toml" --data-dir "$data" >/dev/null 2>"$work/switch.log" &
    local sw=$!
    for _ in $(seq 100); do
        if [ -s "$data/isoswitch.db" ] && sqlite3 -readonly "$data/isoswitch.db" "SELECT 1 FROM journal LIMIT 0" 2>/dev/null; then break; fi
        sleep 0.1
    done
    kill -INT $sw; wait $sw || true
    if [ "$prefill" -gt 0 ]; then prefill_rows "$data/isoswitch.db"; fi
    if [ "$1" = bare ]; then
        sqlite3 "$data/isoswitch.db" "SELECT 'DROP INDEX ' || name || ';' FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'journal' AND sql IS NOT NULL" | sqlite3 "$data/isoswitch.db"
    fi
    sqlite3 "$data/isoswitch.db" "PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
    echo "$data/isoswitch.db"
}

prefill_rows() { # $1 = the file
    local part_col="" part_val="" parts=""
    if [ "$(sqlite3 "$1" "SELECT count(*) FROM pragma_table_info('journal') WHERE name = 'part'")" = 1 ]; then
        # Parts of PART_ROWS (src/store/sqlite/insert.rs) rows, as the
        # switch fills them; a build with another PART_ROWS carries on from
        # the newest part by its own size.
        part_col=", part" part_val=", value / 2048"
        parts="INSERT INTO journal_part (part, t_min, t_max, rows) SELECT part, min(t_in), max(t_in), count(*) FROM journal GROUP BY part;"
    fi
    local t0=$(( $(date +%s) * 1000 - 86400000 ))
    sqlite3 "$1" "PRAGMA temp_store = MEMORY; BEGIN;
INSERT INTO journal (t_in, t_out, service, front, link, node, origin, mti, mti_out, f11, f7,
    f37_in, f37_out, f41, f42, f32, pan, f4, f49, f39, answered_by, outcome, latency_us, late,
    duplicate, repeat, unroutable$part_col)
SELECT $t0 + value / 10, $t0 + value / 10 + 1, 'bench', 'listen', 'client#' || (value % 50), '01',
    'front', '0200', '0210', printf('%06d', value % 1000000), '1204101010',
    printf('%012d', abs(random()) % 1000000000000), printf('%012d', abs(random()) % 1000000000000),
    printf('%08d', abs(random()) % 8000), '123456789012345', '12345678', '622202*********0123',
    '000000010000', '156', '00', 'node', 'answered', 100, 0, 0, 0, 0$part_val
FROM generate_series(1, $prefill);
$parts
COMMIT;" >/dev/null
}

declare -A template_db=()
for m in $modes; do
    case $m in
    off | built) ;;
    on) if [ "$prefill" -gt 0 ]; then template_db[on]=1; fi ;;
    bare) template_db[bare]=1 ;;
    *) echo "bench-journal.sh: MODES takes off, on, built and bare, not \`$m'" >&2; exit 1 ;;
    esac
done
if [ ${#template_db[@]} -gt 0 ] && [ -n "$pg" ]; then
    echo "bench-journal.sh: PREFILL and bare are for SQLite" >&2; exit 1
fi
for m in "${!template_db[@]}"; do
    echo "preparing the $m journal ($prefill rows)" >&2
    template_db[$m]=$(template "$m")
done

run_once() { # $1 = off|on|built|bare; appends its CPU a request to $results
    local data="$work/data-$RANDOM" rows_before=0 toml=on
    case $1 in off | built) toml=$1 ;; esac
    if [ -n "$pg" ]; then rows_before=$(journal_rows "$data"); fi
    if [ -n "${template_db[$1]:-}" ]; then
        mkdir -m 700 "$data"
        cp "${template_db[$1]}" "$data/isoswitch.db"
        rows_before=$prefill
    fi
    ISOSWITCH_LOG=warn $bin run --config "$work/$toml.toml" --data-dir "$data" >/dev/null 2>"$work/switch.log" &
    local sw=$!
    sleep 1.5
    local before after out store_before store_after
    before=$(cpu_ticks $sw)
    store_before=$(store_ns $sw)
    local keys=(--vary-keys)
    if [ -n "${SAME_KEYS:-}" ]; then keys=(); fi
    out=$($bin load --target 127.0.0.1:26700 --spec cups --rate "$rate" --duration "$duration" --quiet --json "${keys[@]}")
    after=$(cpu_ticks $sw)
    store_after=$(store_ns $sw)
    kill -INT $sw; wait $sw || true
    local answered us store_us note=""
    answered=$(python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("answered", d.get("received", 0)))' <<<"$out")
    us=$(python3 -c "print(round(($after-$before)/$tck/$answered*1e6, 2))")
    store_us=$(python3 -c "print(round(($store_after-$store_before)/1e3/$answered, 2))")
    if [ "$1" != off ]; then
        local rows
        rows=$(( $(journal_rows "$data") - rows_before ))
        if [ "$1" = built ]; then
            note=" journal rows $rows (the rest dropped by the one-row queue)"
        else
            note=" journal rows $rows (lost $((answered - rows)))"
        fi
    fi
    rm -rf "$data"
    echo "journal $1: answered $answered, switch CPU $us us/request (store thread $store_us)$note"
    results+="$1 $us $store_us"$'\n'
}

results=""
for round in $(seq "$repeat"); do
    for m in $modes; do
        run_once "$m"
    done
    results+="end $round"$'\n'
done

# Each mode's median, and its median ratio to the `off` of its own round
# (the machine drifts between rounds more than within one).
python3 -c '
import statistics, sys
rounds, cur = [], {}
for line in sys.stdin.read().splitlines():
    key, *values = line.split()
    if key == "end":
        rounds.append(cur)
        cur = {}
    else:
        cur[key] = [float(v) for v in values]
for mode in sys.argv[1].split():
    us = [r[mode][0] for r in rounds]
    store = [r[mode][1] for r in rounds]
    line = f"{mode}: median {statistics.median(us):.2f} us/request (store thread {statistics.median(store):.2f}) over {len(us)} rounds"
    if mode != "off" and "off" in rounds[0]:
        ratio = [r[mode][0] / r["off"][0] for r in rounds]
        rest = [(r[mode][0] - r[mode][1]) - (r["off"][0] - r["off"][1]) for r in rounds]
        line += f", {mode} / off median {statistics.median(ratio):.3f} (rounds {min(ratio):.3f} to {max(ratio):.3f})"
        line += f"; besides the store thread, {statistics.median(rest):+.2f} us/request over off"
    print(line)
' "$modes" <<<"${results%$'\n'}"
