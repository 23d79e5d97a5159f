#!/usr/bin/env bash
# A throwaway PostgreSQL server for the store's tests and bench, on 127.0.0.1
# only, in a directory of its own: nothing else on the host is touched.
#
#   scripts/pg-test.sh start DIR PORT [ADDR CIDR]
#                                       initialise DIR (if new) and start the
#                                       server on 127.0.0.1:PORT (or ADDR:PORT,
#                                       taking logins from CIDR: the HA rig's
#                                       namespaces); prints its URL
#   scripts/pg-test.sh halt DIR         stop the server, keep DIR (start again later)
#   scripts/pg-test.sh stop DIR         stop the server and delete DIR
#   scripts/pg-test.sh run -- CMD...    start one on a free port, run CMD with
#                                       ISOSWITCH_TEST_PG_URL set, stop it
#
# Uses Debian's `postgresql` (scripts/deps/store.apt): installs it when
# initdb is missing and this runs as root, fails otherwise. PostgreSQL refuses
# to run as root, so as root the server runs as the `postgres` user
# (runuser). The superuser is `isoswitch` with a random password, checked
# with scram-sha-256 over TCP.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "pg-test.sh: $*" >&2; exit 1; }

find_bin() {
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
    done
    command -v initdb >/dev/null && { dirname "$(readlink -f "$(command -v initdb)")"; return 0; }
    return 1
}

pg_bin() {
    local bin
    if bin=$(find_bin); then echo "$bin"; return 0; fi
    [ "$(id -u)" -eq 0 ] || die "PostgreSQL's initdb is not installed (apt-get install postgresql, or scripts/install-test-deps.sh as root)"
    echo "pg-test.sh: installing postgresql" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    find_bin || die "postgresql installed but initdb not found under /usr/lib/postgresql/*/bin"
}

# Runs a command as the server's user: postgres when we are root.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

start() {
    local dir=$1 port=$2 addr=${3:-127.0.0.1} allow=${4:-} bin
    bin=$(pg_bin)
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || die "no postgres user to run the server as (it comes with the postgresql package)"
        chown postgres "$dir"
    fi
    chmod 700 "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/password"
        chmod 600 "$dir/password"
        [ "$(id -u)" -eq 0 ] && chown postgres "$dir/password"
        as_owner "$bin/initdb" -D "$dir/data" -U isoswitch --pwfile="$dir/password" \
            --auth-host=scram-sha-256 --auth-local=trust -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; die "initdb failed in $dir"; }
    fi
    # Logins from another network (password checked, as on loopback).
    if [ -n "$allow" ] && ! grep -q "^host all all $allow " "$dir/data/pg_hba.conf"; then
        echo "host all all $allow scram-sha-256" >>"$dir/data/pg_hba.conf"
    fi
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=$addr -c port=$port -c unix_socket_directories=$dir" start >/dev/null \
        || { cat "$dir/server.log" >&2 2>/dev/null; die "the server in $dir did not start on $addr:$port"; }
    echo "postgres://isoswitch:$(cat "$dir/password")@$addr:$port/postgres"
}

halt() {
    local dir=$1 bin
    [ -d "$dir/data" ] || return 0
    bin=$(find_bin) || die "initdb/pg_ctl not found"
    [ -f "$dir/data/postmaster.pid" ] || return 0
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null \
        || die "the server in $dir did not stop (left in place)"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

case "${1:-}" in
    start) [ $# -eq 3 ] || [ $# -eq 5 ] || die "usage: start DIR PORT [ADDR CIDR]"; start "$2" "$3" "${4:-}" "${5:-}" ;;
    halt) [ $# -eq 2 ] || die "usage: halt DIR"; halt "$2" ;;
    stop) [ $# -eq 2 ] || die "usage: stop DIR"; halt "$2" && rm -rf "$2" ;;
    run)
        shift
        [ "${1:-}" = "--" ] && shift
        [ $# -gt 0 ] || die "usage: run -- CMD..."
        dir=$(mktemp -d /tmp/isoswitch-pg.XXXXXX)
        trap 'halt "$dir"; rm -rf "$dir"' EXIT
        ISOSWITCH_TEST_PG_URL=$(start "$dir" "$(free_port)")
        export ISOSWITCH_TEST_PG_URL
        "$@"
        ;;
    *) die "usage: start DIR PORT [ADDR CIDR] | halt DIR | stop DIR | run -- CMD..." ;;
esac
