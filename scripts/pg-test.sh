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
#                                       ISOSWITCH_TEST_PG_URL and
#                                       ISOSWITCH_TEST_PG_CA set, stop it
#
# Uses Debian's `postgresql` (scripts/deps/store.apt): installs it when
# initdb is missing and this runs as root, fails otherwise. PostgreSQL refuses
# to run as root, so as root the server runs as the `postgres` user
# (runuser). The superuser is `isoswitch` with a random password, checked
# with scram-sha-256 over TCP.
#
# TCP takes TLS only (pg_hba `hostssl`, `hostnossl ... reject`): at init a
# throwaway CA and a server certificate for the listen address, 127.0.0.1
# and localhost are made with openssl in DIR/tls; clients verify against
# DIR/tls/ca.crt (store.ca_file; `run` exports it as ISOSWITCH_TEST_PG_CA).
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

# A CA and a server certificate (ECDSA P-256) naming ADDR, 127.0.0.1 and
# localhost, in DIR/tls; the key readable by the server's user only.
make_tls() {
    local dir=$1 addr=$2 tls=$1/tls
    command -v openssl >/dev/null || die "openssl is not installed (scripts/deps/store.apt): the test server takes TLS only"
    mkdir -p "$tls"
    (
        set -e
        cd "$tls"
        openssl ecparam -name prime256v1 -genkey -noout -out ca.key
        openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=isoswitch test PostgreSQL CA" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
        openssl ecparam -name prime256v1 -genkey -noout -out server.key
        openssl req -new -key server.key -subj "/CN=$addr" -out server.csr
        printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' "$addr" >server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 30 \
            -extfile server.ext -out server.crt
        rm -f ca.key server.csr ca.srl
        chmod 600 server.key
        chmod 644 ca.crt server.crt
    ) >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; die "openssl could not make the test certificates in $tls"; }
    [ "$(id -u)" -eq 0 ] && chown -R postgres "$tls"
    return 0
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
        make_tls "$dir" "$addr"
        # TCP logins over TLS only: a client in clear is turned away.
        sed -i 's/^host\([[:space:]]\)/hostssl\1/' "$dir/data/pg_hba.conf"
        printf 'hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n' >>"$dir/data/pg_hba.conf"
    fi
    # Logins from another network (password checked, as on loopback).
    # (before the `hostnossl ... reject` lines would not matter: those only
    # match connections in clear.)
    if [ -n "$allow" ] && ! grep -q "^hostssl all all $allow " "$dir/data/pg_hba.conf"; then
        echo "hostssl all all $allow scram-sha-256" >>"$dir/data/pg_hba.conf"
    fi
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=$addr -c port=$port -c unix_socket_directories=$dir -c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key -c ssl_min_protocol_version=TLSv1.2" start >/dev/null \
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
        ISOSWITCH_TEST_PG_CA=$dir/tls/ca.crt
        export ISOSWITCH_TEST_PG_URL ISOSWITCH_TEST_PG_CA
        "$@"
        ;;
    *) die "usage: start DIR PORT [ADDR CIDR] | halt DIR | stop DIR | run -- CMD..." ;;
esac
