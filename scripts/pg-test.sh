#!/usr/bin/env bash
# A throwaway PostgreSQL server for the store's tests and bench, on 127.0.0.1
# only, in a directory of its own: nothing else on the host is touched.
#
#   scripts/pg-test.sh start DIR PORT [ADDR CIDR]
#                                       initialise DIR (if new) and start the
#                                       server on 127.0.0.1:PORT (or ADDR:PORT,
#                                       taking logins from CIDR: the HA rig's
#                                       namespaces); prints its URL
#   scripts/pg-test.sh standby DIR PORT ADDR CIDR PRIMARY_DIR PRIMARY_ADDR:PORT
#                                       a hot standby of that primary in DIR
#                                       (pg_basebackup over TLS, streaming
#                                       replication), started on ADDR:PORT;
#                                       the primary then commits only once
#                                       the standby has the WAL
#                                       (synchronous_standby_names = '*')
#   scripts/pg-test.sh promote DIR      the standby in DIR becomes a primary
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
# PG_TEST_ALSO_IPS (space-separated) adds addresses to the certificate: a
# standby made later from this server uses the same certificate and key.
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
        local also="" ip
        for ip in ${PG_TEST_ALSO_IPS:-}; do also="$also,IP:$ip"; done
        printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:localhost%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' "$addr" "$also" >server.ext
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
        # A standby on that network streams the WAL (`standby`).
        echo "hostssl replication all $allow scram-sha-256" >>"$dir/data/pg_hba.conf"
    fi
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=$addr -c port=$port -c unix_socket_directories=$dir -c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key -c ssl_min_protocol_version=TLSv1.2" start >/dev/null \
        || { cat "$dir/server.log" >&2 2>/dev/null; die "the server in $dir did not start on $addr:$port"; }
    echo "postgres://isoswitch:$(cat "$dir/password")@$addr:$port/postgres"
}

# A hot standby of the primary in PRIMARY_DIR (reached at PADDR:PPORT),
# made with pg_basebackup over TLS (verify-full against the primary's CA)
# and started on ADDR:PORT. Its TLS files and password are the primary's
# (the certificate names both addresses: PG_TEST_ALSO_IPS at the primary's
# init). Once it streams, the primary waits for it at each commit.
standby() {
    local dir=$1 port=$2 addr=$3 allow=$4 primary=$5 paddr=${6%:*} pport=${6##*:} bin conninfo i
    bin=$(pg_bin)
    [ -f "$primary/password" ] || die "no primary in $primary"
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -r "$primary/tls" "$primary/password" "$dir/"
    [ "$(id -u)" -eq 0 ] && chown -R postgres "$dir"
    chmod 700 "$dir"
    conninfo="host=$paddr port=$pport user=isoswitch password=$(cat "$dir/password") sslmode=verify-full sslrootcert=$dir/tls/ca.crt application_name=standby"
    as_owner "$bin/pg_basebackup" -d "$conninfo" -D "$dir/data" -R -X stream -c fast >"$dir/basebackup.log" 2>&1 \
        || { cat "$dir/basebackup.log" >&2; die "pg_basebackup from $paddr:$pport failed"; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=$addr -c port=$port -c unix_socket_directories=$dir -c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key -c ssl_min_protocol_version=TLSv1.2 -c hot_standby=on" start >/dev/null \
        || { cat "$dir/server.log" >&2 2>/dev/null; die "the standby in $dir did not start on $addr:$port"; }
    # Synchronous from now on: a commit the primary acknowledges is on both.
    as_owner "$bin/psql" -h "$primary" -p "$pport" -U isoswitch -d postgres -qAt \
        -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null \
        || die "cannot make the primary's replication synchronous"
    for ((i = 0; i < 100; i++)); do
        [ "$(as_owner "$bin/psql" -h "$primary" -p "$pport" -U isoswitch -d postgres -qAt \
            -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'")" = 1 ] && return 0
        sleep 0.1
    done
    die "the standby in $dir is not streaming synchronously from $paddr:$pport after 10 s"
}

# The standby in DIR becomes a primary (pg_ctl promote waits for it).
promote() {
    local dir=$1 bin
    bin=$(find_bin) || die "pg_ctl not found"
    as_owner "$bin/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null \
        || die "the standby in $dir was not promoted"
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
    standby) [ $# -eq 7 ] || die "usage: standby DIR PORT ADDR CIDR PRIMARY_DIR PRIMARY_ADDR:PORT"; standby "$2" "$3" "$4" "$5" "$6" "$7" ;;
    promote) [ $# -eq 2 ] || die "usage: promote DIR"; promote "$2" ;;
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
    *) die "usage: start DIR PORT [ADDR CIDR] | standby DIR PORT ADDR CIDR PRIMARY_DIR ADDR:PORT | promote DIR | halt DIR | stop DIR | run -- CMD..." ;;
esac
