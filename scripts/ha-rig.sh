#!/usr/bin/env bash
# Two to four isoswitch instances (HA_INSTANCES, default 2; CI runs 3)
# behind one virtual IP held by keepalived (VRRP), on a PostgreSQL primary
# with a synchronous hot standby, in network namespaces this script creates:
# nothing on the host is touched (docs/ha.md).
#
#   scripts/ha-rig.sh up     build the rig and leave it running
#   scripts/ha-rig.sh test   up, then the four phases below, then down; the
#                            last line gives the failover times and the counts
#   scripts/ha-rig.sh down   stop everything the rig started, delete its
#                            namespaces (safe after a failed or partial run)
#
# Namespaces (prefix $HA_PREFIX, default isoha: use your own when others may
# run the rig on this machine), all on one bridge that lives in its own
# namespace (<p>-lan), 10.209.0.0/24:
#   <p>-client .10   ATMs (isoswitch load --connection-per-request), a NAC
#   <p>-a      .11   isoswitch A + keepalived (priority 150: master)
#   <p>-b      .12   isoswitch B + keepalived (100); C .13 (50), D .14 (25)
#   <p>-nodes  .20   channel nodes (sim node): POS 01 02, UnionPay 01 02 03, saf 04 05
#   <p>-cups   .30   UnionPay (sim cups): 8 in links split across the instances
#   <p>-db     .40   PostgreSQL primary: the store every instance shares
#   <p>-db2    .41   its synchronous hot standby (streaming replication)
#   virtual IP .100  the clients' address of the switch (VRRP)
#
# Phases of `test`:
#   1. UnionPay across every instance: issuer requests and node 03's
#      acquirer requests both ways; every answer exactly once, answers
#      crossing between every instance's out and in links (F37 alone).
#   2. What A owes, then failover under load: a NAC on A's own address gets
#      late approvals and stored advices (nodes 04/05 ignore each reversal
#      chain's first message and every original advice), so A holds both in
#      the shared store; then ATMs and a NAC on the VIP, kill -9 of switch A;
#      B takes the VIP; answered = sent - lost, lost <= what can be in
#      flight, nothing doubled.
#   3. The survivors alone: their links signed on, UnionPay both ways, a NAC
#      on the VIP; they deliver every reversal and advice A owed, as
#      repeats, completed_by one of them, once each.
#   4. The database fails over under load: kill -9 of the primary while
#      reversals are being stored, the standby promoted 1 s later; every
#      instance reconnects by itself, the ATMs get every answer, every late
#      approval is reversed, the journal keeps what was committed 1 s
#      before the kill.
#
# Needs root, iproute2, keepalived, curl, python3 (installs the Debian
# packages of scripts/deps/ha.apt when missing) and PostgreSQL (installed by
# scripts/pg-test.sh when missing). Every wait is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."

P=${HA_PREFIX:-isoha}
WORK=${HA_WORK:-/tmp/$P}
BIN=${ISOSWITCH_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/debug/isoswitch}
NET=10.209.0
VIP=$NET.100
declare -A IP=([client]=$NET.10 [a]=$NET.11 [b]=$NET.12 [c]=$NET.13 [d]=$NET.14 [nodes]=$NET.20 [cups]=$NET.30 [db]=$NET.40 [db2]=$NET.41)
# How many switch instances (HA_INSTANCES, 2 to 4): A, B, C, D. A is the
# VRRP master and the one killed; the others survive it.
INSTANCES=${HA_INSTANCES:-2}
case "$INSTANCES" in 2 | 3 | 4) ;; *) echo "ha-rig: HA_INSTANCES must be 2, 3 or 4 (not $INSTANCES)" >&2; exit 2 ;; esac
ALL_SWITCHES=(a b c d)
SWITCHES_ALL=("${ALL_SWITCHES[@]:0:INSTANCES}")
SURVIVORS=("${SWITCHES_ALL[@]:1}")
HOSTS=(client "${SWITCHES_ALL[@]}" nodes cups db db2)
# Every namespace the rig may have made, whatever the count (for `down`).
EVERY_HOST=(client a b c d nodes cups db db2 lan)
# UnionPay's 8 links, split: the first 8 % N instances take one more.
UP_LINKS=8
declare -A SHARE=()
for ((i = 0; i < INSTANCES; i++)); do
    SHARE[${SWITCHES_ALL[i]}]=$((UP_LINKS / INSTANCES + (i < UP_LINKS % INSTANCES ? 1 : 0)))
done
# The replicated store: primary in <p>-db, synchronous hot standby in <p>-db2.
PG_PORT=5432
ADMIN=127.0.0.1:9090
export ISOSWITCH_ADMIN_TOKEN=ha-rig-token-0123456789abcdef
ATM_CLIENTS=${HA_ATM_CLIENTS:-20}

log() { printf '%s ha-rig: %s\n' "$(date -u +%H:%M:%S.%N | cut -c1-12)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
ns() { echo "$P-$1"; }
in_ns() { local h=$1; shift; ip netns exec "$(ns "$h")" "$@"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

need_root_and_tools() {
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth, keepalived); run it as root"
    local missing=()
    command -v keepalived >/dev/null || missing+=(keepalived)
    command -v ip >/dev/null || missing+=(iproute2)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    # Installed here, not by pg-test.sh: inside the rig's namespaces there is
    # no route to a package mirror.
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]} (scripts/deps/ha.apt)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    command -v keepalived >/dev/null || die "keepalived is missing and could not be installed"
    ip netns list >/dev/null || die "ip netns does not work here"
}

# Starts a background process inside a namespace; remembers its PID (the
# process itself: `ip netns exec` execs it) under $WORK/pids/NAME.
spawn() {
    local name=$1 host=$2; shift 2
    # Not through a shell function: $! must be the process itself, so that
    # kill -INT / -9 reach it.
    ip netns exec "$(ns "$host")" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
    echo $! >"$WORK/pids/$name"
    # Out of the job table: no "Killed" notice after the last line when
    # `down` ends it. Its outcome is read from its report, not its status.
    disown $!
}
pid_of() { cat "$WORK/pids/$1"; }

# Waits for a PID to exit within $2 seconds; 124 if it did not.
wait_exit() {
    local pid=$1 limit=$2 i
    for ((i = 0; i < limit * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    return 124
}

# Polls a command every 0.1 s for at most $1 seconds.
wait_for() {
    local limit=$1 i; shift
    for ((i = 0; i < limit * 10; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

api() { in_ns "$1" curl -sf -m 2 -H "Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN" "http://$ADMIN$2"; }
ready() { api "$1" /readyz >/dev/null; }
api_post() { in_ns "$1" curl -sf -m 2 -X POST -H "Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN" -H "Content-Type: application/json" "http://$ADMIN$2" >/dev/null; }
has_vip() { in_ns "$1" ip -4 addr show dev veth0 | grep -q "inet $VIP/"; }

# One field of a service in /api/v1/status (python expression on `s`).
service_field() {
    local host=$1 service=$2 expr=$3
    api "$host" /api/v1/status | python3 -c "
import json, sys
s = next(x for x in json.load(sys.stdin)['services'] if x['name'] == '$service')
print($expr)"
}

# A JSON field of a report file (python expression on `r`).
field() { python3 -c "import json, sys; r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print($2)" "$1"; }

switch_config() {
    local me=$1
    cat <<EOF
# isoswitch $me of the HA rig: identical on every instance but for its
# share of UnionPay's links: the same node ids (so the F37 stamp of a node
# is the same everywhere), the same listen ports (the VIP lands on any), one
# store (what A owes, a survivor delivers), named by both its servers: the
# primary and its standby (the store connects to whichever takes writes).
[admin]
listen = "$ADMIN"

[store]
url = "$STORE_URL"
# Both instances seal and open the shared SAF entries with this key.
key_file = "$WORK/store.key"
# The database's CA (scripts/pg-test.sh made it): the store is remote, so
# TLS with verify-full.
ca_file = "$WORK/pg/tls/ca.crt"
[store.saf]
# A failed reversal attempt is tried again 20 s later: A is killed before
# that, so the second attempt is B's. A lease outlives a dead instance 3 s.
retry = "20s"
retry_max = "20s"
lease = "3s"

[[service]]
name = "saf"
spec = "cup-pos"
# Advices (the NAC's 0220s) are stored, acknowledged, then delivered from
# the shared queue: what A acknowledged and could not deliver, a survivor
# delivers.
[service.integrity]
advices = "store-and-forward"
[service.front]
kind = "listen"
listen = "0.0.0.0:7002"
[service.back]
connections_per_node = 1
[[service.back.node]]
id = "04"
address = "${IP[nodes]}:7104"
[[service.back.node]]
id = "05"
address = "${IP[nodes]}:7105"
[service.timeouts]
request = "500ms"
by_mti = { "04x0" = "1s" }

[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "0.0.0.0:7001"
[service.back]
connections_per_node = 2
[service.back.health]
interval = "500ms"
[[service.back.node]]
id = "01"
address = "${IP[nodes]}:7101"
[[service.back.node]]
id = "02"
address = "${IP[nodes]}:7102"
[service.timeouts]
request = "3s"

[[service]]
name = "atm"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "0.0.0.0:7000"
mode = "oneconnect"
[service.back]
connections_per_node = 8
[service.back.health]
interval = "500ms"
[[service.back.node]]
id = "01"
address = "${IP[nodes]}:7101"
[[service.back.node]]
id = "02"
address = "${IP[nodes]}:7102"
[service.timeouts]
request = "3s"

[[service]]
name = "unionpay"
spec = "cups"
f37_stamp = { offset = 10, width = 2 }
[service.front]
kind = "simplex"
connect = "${IP[cups]}:9001"
listen = "0.0.0.0:9101"
links = ${SHARE[$me]}
max_in_links = ${SHARE[$me]}
allow = ["${IP[cups]}/32"]
member_id = "03105840"
peer_id = "00010000"
reconnect_min = "100ms"
reconnect_max = "1s"
sign_on = "per-link"
sign_on_retry = "1s"
[service.back]
connections_per_node = 2
# A response routed by F37 needs this instance's live connection to the
# node: reconnect to a node that comes back within half a second.
reconnect_min = "100ms"
reconnect_max = "500ms"
[service.back.health]
interval = "500ms"
[[service.back.node]]
id = "01"
address = "${IP[nodes]}:7201"
[[service.back.node]]
id = "02"
address = "${IP[nodes]}:7202"
[[service.back.node]]
id = "03"
address = "${IP[nodes]}:7203"
[service.timeouts]
request = "3s"
EOF
}

keepalived_config() {
    local me=$1 priority=$2
    cat <<EOF
global_defs {
    router_id isoswitch-$me
    script_user root
    enable_script_security
    # Gratuitous ARPs spread over 1.5 s instead of one burst: a neighbour
    # ignores ARP updates within its locktime (1 s) of the last one, so a
    # burst can leave clients sending to the dead box's MAC until their SYN
    # retransmits.
    vrrp_garp_master_repeat 6
    vrrp_garp_interval 0.3
}
# The switch's own liveness: when isoswitch dies the check fails at once,
# this instance goes to FAULT and gives up the address.
vrrp_script isoswitch_alive {
    script "/usr/bin/curl -sf -m 1 -o /dev/null http://$ADMIN/healthz"
    interval 1
    timeout 1
    fall 1
    rise 2
}
vrrp_instance isoswitch {
    state BACKUP
    interface veth0
    virtual_router_id 51
    priority $priority
    advert_int 1
    unicast_src_ip ${IP[$me]}
    unicast_peer {
$(for h in "${SWITCHES_ALL[@]}"; do [ "$h" = "$me" ] || echo "        ${IP[$h]}"; done)
    }
    virtual_ipaddress {
        $VIP/24 dev veth0
    }
    track_script {
        isoswitch_alive
    }
}
EOF
}

up() {
    need_root_and_tools
    down_quiet
    mkdir -p "$WORK/pids"
    [ -x "$BIN" ] || cargo build --locked --quiet
    [ -x "$BIN" ] || die "no isoswitch binary at $BIN"
    log "namespaces and the bridge ($(ns lan))"
    ip netns add "$(ns lan)"
    ip -n "$(ns lan)" link set lo up
    ip -n "$(ns lan)" link add br0 type bridge
    ip -n "$(ns lan)" link set br0 up
    for h in "${HOSTS[@]}"; do
        ip netns add "$(ns "$h")"
        ip -n "$(ns "$h")" link set lo up
        # Both ends are made inside the rig's namespaces.
        ip -n "$(ns "$h")" link add veth0 type veth peer name "p-$h" netns "$(ns lan)"
        ip -n "$(ns lan)" link set "p-$h" master br0 up
        ip -n "$(ns "$h")" addr add "${IP[$h]}/24" dev veth0
        ip -n "$(ns "$h")" link set veth0 up
    done

    log "PostgreSQL (the shared store): primary on ${IP[db]}, synchronous hot standby on ${IP[db2]}"
    rm -rf "$WORK/pg" "$WORK/pg2"
    local primary_url
    primary_url=$(PG_TEST_ALSO_IPS="${IP[db2]}" in_ns db scripts/pg-test.sh start "$WORK/pg" $PG_PORT "${IP[db]}" "$NET.0/24") \
        || die "PostgreSQL did not start in $(ns db)"
    in_ns db2 scripts/pg-test.sh standby "$WORK/pg2" $PG_PORT "${IP[db2]}" "$NET.0/24" "$WORK/pg" "${IP[db]}:$PG_PORT" \
        || die "the standby did not start in $(ns db2)"
    # Both servers in the URL: the store takes the one that takes writes,
    # and finds the promoted standby by itself when the primary dies.
    STORE_URL="${primary_url%@*}@${IP[db]}:$PG_PORT,${IP[db2]}:$PG_PORT/postgres?target_session_attrs=read-write"

    log "the store's data key (both instances seal with it)"
    rm -f "$WORK/store.key"
    (umask 077; printf '1 %s\n' "$(python3 -c 'import secrets; print(secrets.token_hex(32))')" >"$WORK/store.key")

    log "channel nodes"
    for id in 01 02; do
        spawn "node-pos-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:71${id}" --spec cup-pos --id "$id" --delay 1ms..5ms --json
        spawn "node-cups-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:72${id}" --spec cups --id "$id" --delay 1ms..5ms --json
    done
    # The saf service's hosts: a tenth of approvals a second late (past the
    # switch's 500 ms), the first message of each reversal chain unanswered,
    # and every original advice (0220) too: only repeats are acknowledged.
    for id in 04 05; do
        spawn "node-saf-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:71${id}" --spec cup-pos --id "$id" \
            --delay 1ms..5ms --late-share 0.1 --late-by 1s --ignore-reversals 1 --ignore-advice-originals --json
    done
    wait_for 10 in_ns client python3 -c "import socket; socket.create_connection(('${IP[nodes]}', 7101), 1)" \
        || die "the bridge does not carry traffic (client -> nodes)"

    log "isoswitch ${SWITCHES_ALL[*]^^}"
    for h in "${SWITCHES_ALL[@]}"; do
        switch_config "$h" >"$WORK/switch-$h.toml"
        # A data directory each: A and B share this filesystem, not their state.
        rm -rf "$WORK/data-$h"
        spawn "switch-$h" "$h" env ISOSWITCH_LOG=warn "$BIN" run --config "$WORK/switch-$h.toml" --data-dir "$WORK/data-$h"
    done
    for h in "${SWITCHES_ALL[@]}"; do
        wait_for 20 in_ns "$h" curl -sf -m 1 "http://$ADMIN/healthz" \
            || { tail -20 "$WORK/switch-$h.log" >&2; die "switch $h did not start"; }
    done

    log "keepalived (VRRP): A 150 (master), then 100, 50, 25"
    local prio=150
    for h in "${SWITCHES_ALL[@]}"; do
        keepalived_config "$h" $prio >"$WORK/keepalived-$h.conf"
        prio=$([ $prio -eq 150 ] && echo 100 || echo $((prio / 2)))
    done
    for h in "${SWITCHES_ALL[@]}"; do
        # A keepalived killed with -9 (every `down`) leaves its PID files,
        # and one that finds a live process under a PID it recorded, now
        # another's, says "daemon is already running" and exits: the VIP
        # never comes up. These files are the rig's own.
        rm -f "$WORK/keepalived-$h.pid" "$WORK/keepalived-$h-vrrp.pid"
        # -n: stay in the foreground (its PID is ours); -P: VRRP only; own
        # PID files, so nothing under /run is shared with a host keepalived.
        spawn "keepalived-$h" "$h" keepalived -n -l -D -P -f "$WORK/keepalived-$h.conf" \
            -p "$WORK/keepalived-$h.pid" -r "$WORK/keepalived-$h-vrrp.pid"
    done
    wait_for 15 has_vip a || { tail -30 "$WORK/keepalived-a.log" >&2; die "the VIP did not come up on A (VRRP)"; }
    for h in "${SURVIVORS[@]}"; do
        has_vip "$h" && die "the VIP is on both A and ${h^^}"
    done
    log "VIP $VIP is on A"
}

# Stops every process in the rig's namespaces (they are all the rig's own),
# then deletes the namespaces: the veths and the bridge go with them.
down_quiet() {
    local h pids
    # The store first, gently: a server killed with -9 can leave its shared
    # memory behind.
    [ ! -d "$WORK/pg2/data" ] || scripts/pg-test.sh halt "$WORK/pg2" >/dev/null 2>&1 || true
    [ ! -d "$WORK/pg/data" ] || scripts/pg-test.sh halt "$WORK/pg" >/dev/null 2>&1 || true
    for h in "${EVERY_HOST[@]}"; do
        if ip netns list 2>/dev/null | grep -qw "$(ns "$h")"; then
            pids=$(ip netns pids "$(ns "$h")" 2>/dev/null || true)
            # shellcheck disable=SC2086
            [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
        fi
    done
    if [ -d "$WORK/pids" ]; then
        for f in "$WORK"/pids/*; do
            [ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
        done
    fi
    sleep 0.2
    for h in "${EVERY_HOST[@]}"; do
        ip netns del "$(ns "$h")" 2>/dev/null || true
    done
    rm -rf "$WORK/pids"
    rm -f "$WORK"/keepalived-*.pid
}

down() {
    [ "$(id -u)" -eq 0 ] || die "needs root"
    down_quiet
    log "down: namespaces $P-* deleted"
}

# True when switch $1 holds $2 UnionPay in links and all its out links are
# signed on.
links_ready() {
    local links in_up signed total
    links=$(service_field "$1" unionpay "f\"{s['links']['in_links']} {s['links']['signed_on']} {s['links']['links']}\"") || return 1
    read -r in_up signed total <<<"$links"
    [ "$in_up" -ge "$2" ] && [ "$signed" -eq "$total" ]
}

# Starts UnionPay (8 in links: 4 to A, 4 to B) and waits until the switches
# in `$@` report every service ready (out links signed on) and hold their 4
# in links: a round that starts earlier sends UnionPay's answers only to the
# instances whose in links are up.
start_cups() {
    local name=$1 h links=0 targets=(); shift
    # In link i goes to target i % n: with the instances in order, each
    # gets its share (3, 3, 2 of 8 for three; 3 + 2 for B and C alone).
    for h in "$@"; do
        links=$((links + SHARE[$h]))
        if [ ${#targets[@]} -eq 0 ]; then targets+=(--connect "${IP[$h]}:9101"); else targets+=(--also-connect "${IP[$h]}:9101"); fi
    done
    spawn "$name" cups "$BIN" sim cups --accept "${IP[cups]}:9001" \
        "${targets[@]}" --links "$links" \
        --rate 40 --duration 120s --require-sign-on --json
    for h in "$@"; do
        wait_for 20 ready "$h" || { api "$h" /api/v1/status >&2 || true; die "switch $h not ready with UnionPay up"; }
        wait_for 20 links_ready "$h" "${SHARE[$h]}" || { api "$h" /api/v1/status >&2 || true; die "switch $h: not ${SHARE[$h]} in links and every out link signed on"; }
    done
}

# Runs UnionPay node 03 with node-originated requests for $2 seconds, then
# stops it (Ctrl-C: stops originating, waits for the answers) and stops
# UnionPay; both reports are in $WORK.
unionpay_round() {
    local tag=$1 seconds=$2 cups=$3
    # Node 03 originates only once every live switch holds connections to it:
    # an answer that lands on an instance without one could not be routed.
    # Each round's node 03 starts its STANs past the last round's (its
    # requests carry a fixed F7): the instances remember the first round's
    # for their duplicate window (5 min), and the same STAN again would
    # rightly be a duplicate.
    local stan_from=1
    [ "$tag" = both ] || stan_from=50001
    spawn "node-cups-03-$tag" nodes "$BIN" sim node --listen "${IP[nodes]}:7203" --spec cups --id 03 \
        --delay 1ms..5ms --originate 40 --originate-after 3s --stan-from $stan_from --json
    local h
    for h in "${SWITCHES[@]}"; do
        wait_for 3 sh -c "[ \"\$(ip netns exec $(ns "$h") curl -sf -m 1 -H 'Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN' http://$ADMIN/api/v1/status | python3 -c \"import json,sys; s=next(x for x in json.load(sys.stdin)['services'] if x['name']=='unionpay'); print(next(n for n in s['nodes'] if n['id']=='03')['connections'])\")\" -ge 2 ]" \
            || die "switch $h did not connect to node 03 within 3 s"
    done
    for h in "${SWITCHES[@]}"; do
        # Back in service (a previous round drained it).
        api_post "$h" /api/v1/services/unionpay/nodes/03/enable || die "switch $h: cannot enable node 03"
    done
    sleep "$seconds"
    # Stopped the way an operator stops a node: drained on every instance
    # first, so no issuer request is in flight on it when it goes (the
    # switch would decline those, correctly, and UnionPay count them).
    for h in "${SWITCHES[@]}"; do
        api_post "$h" /api/v1/services/unionpay/nodes/03/drain || die "switch $h: cannot drain node 03"
    done
    for h in "${SWITCHES[@]}"; do
        wait_for 5 sh -c "[ \"\$(ip netns exec $(ns "$h") curl -sf -m 1 -H 'Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN' http://$ADMIN/api/v1/status | python3 -c \"import json,sys; s=next(x for x in json.load(sys.stdin)['services'] if x['name']=='unionpay'); print(next(n for n in s['nodes'] if n['id']=='03')['in_flight'])\")\" -eq 0 ]" \
            || die "switch $h: node 03 still has requests in flight 5 s after its drain"
    done
    kill -INT "$(pid_of "node-cups-03-$tag")"
    wait_exit "$(pid_of "node-cups-03-$tag")" 20 || die "node 03 ($tag) did not stop within 20 s"
    kill -INT "$(pid_of "$cups")"
    wait_exit "$(pid_of "$cups")" 20 || true
    [ -s "$WORK/$cups.out" ] || die "UnionPay ($cups) printed no report"
}

# A NAC on the VIP until epoch second $1. `sim nac` ends when its uplinks
# die (its terminals stop on a dead uplink); like a NAC's uplink cards, the
# loop then connects again, to whichever instance holds the VIP. Each run's
# report is $WORK/nac-f<N>.out.
nac_through_failover() {
    local until=$1 i=0 left
    while :; do
        left=$(python3 -c "import sys, time; print(int(float(sys.argv[1]) - time.time()))" "$until")
        [ "$left" -ge 2 ] || break
        i=$((i + 1))
        ip netns exec "$(ns client)" "$BIN" sim nac --connect "$VIP:7001" --uplinks 2 --terminals 20 \
            --rate 200 --duration "${left}s" --timeout 1s --json >"$WORK/nac-f$i.out" 2>"$WORK/nac-f$i.log" || true
        # Refused (the VIP is between instances): try again shortly.
        [ -s "$WORK/nac-f$i.out" ] || sleep 0.1
    done
}

# The saf service's entries in state $2, as switch $1's admin API lists them.
saf_rows() { api "$1" "/api/v1/saf?service=saf&state=$2&limit=1000"; }
saf_count() { saf_rows "$1" "$2" | python3 -c "import json, sys; print(len(json.load(sys.stdin)))"; }

# Before the kill: late approvals through A's own address. Their reversals
# are stored in the shared store and still owed when this returns: the nodes
# ignore each chain's first message and the next attempt is 20 s away.
owe_through_a() {
    # A fifth of the NAC's transactions are advices (0220): A stores each,
    # acknowledges it, and sends it on; the node ignores that first attempt.
    spawn nac-saf client "$BIN" sim nac --connect "${IP[a]}:7002" --uplinks 2 --terminals 20 \
        --rate 100 --duration 2s --advice-share 0.2 --json
    wait_exit "$(pid_of nac-saf)" 20 || die "the NAC on A's saf service did not finish"
    local sent unanswered last=-1 n=0 i
    sent=$(field "$WORK/nac-saf.out" "r['sent']")
    # The late ones were declined by the switch (68) at its timeout.
    unanswered=$(field "$WORK/nac-saf.out" "r['unanswered'] + r['mismatched'] + r['sent'] - r['answered'] - r['declined']")
    [ "$sent" -gt 0 ] && [ "$unanswered" -eq 0 ] || die "NAC on A's saf service: $(tail -1 "$WORK/nac-saf.out")"
    # Late approvals come up to 1 s after the last answer: settled when two
    # reads 0.7 s apart agree.
    for ((i = 0; i < 15; i++)); do
        n=$(saf_count a pending) || die "A's /api/v1/saf did not answer"
        [ "$n" -gt 0 ] && [ "$n" -eq "$last" ] && break
        last=$n
        sleep 0.7
    done
    [ "$n" -gt 0 ] && [ "$n" -eq "$last" ] || die "A holds no reversal owed, or their count did not settle ($n)"
    [ "$(saf_count a delivered)" -eq 0 ] || die "A delivered a reversal or advice before its kill: the rig's timing is off"
    OWED=$n
    OWED_REV=$(saf_rows a pending | python3 -c "import json, sys; print(sum(r['kind'] == 'reversal' for r in json.load(sys.stdin)))")
    OWED_ADV=$((OWED - OWED_REV))
    [ "$OWED_REV" -gt 0 ] && [ "$OWED_ADV" -gt 0 ] || die "A should owe both reversals and advices: $OWED_REV, $OWED_ADV"
    log "A owes $OWED_REV reversals (late approvals of $sent requests) and $OWED_ADV stored advices, in PostgreSQL"
}

# After the kill: the survivors deliver every reversal and advice A stored,
# as repeats (0421, 0221): each reversal once to the node that approved,
# each advice to whichever node the balancer picked; the nodes' books agree.
b_delivers_what_a_owed() {
    local names=() h delivered=0 i s=${SURVIVORS[0]}
    for h in "${SURVIVORS[@]}"; do names+=("$(cat "$WORK/data-$h/instance-name")"); done
    # A's next attempts were due 20 s after its first: bounded well past it.
    for ((i = 0; i < 80; i++)); do
        delivered=$(saf_count "$s" delivered) || delivered=0
        [ "$delivered" -ge "$OWED" ] && break
        sleep 0.5
    done
    [ "$delivered" -eq "$OWED" ] || die "the survivors delivered $delivered of the $OWED entries A owed (pending: $(saf_rows "$s" pending))"
    [ "$(saf_count "$s" pending)" -eq 0 ] || die "entries still owed after the survivors delivered $delivered"
    local by
    by=$(saf_rows "$s" delivered | python3 -c "
import collections, json, sys
rows = json.load(sys.stdin)
names = sys.argv[1:]
bad = [r for r in rows if r.get('completed_by') not in names or r['attempts'] < 2]
if bad:
    sys.exit(f'not delivered by a survivor ({names}) as a repeat: {bad}')
by = collections.Counter(r['completed_by'] for r in rows)
print(' '.join(f'{n}:{by[n]}' for n in names))" "${names[@]}") \
        || die "the survivors did not deliver every entry A owed themselves"
    log "what A owed, delivered (completed_by): $by"
    local id late=0 intime=0 chains=0 repeats=0 ignored=0 arepeats=0 r
    for id in 04 05; do
        kill -INT "$(pid_of "node-saf-$id")"
        wait_exit "$(pid_of "node-saf-$id")" 20 || die "node $id did not stop"
        r="$WORK/node-saf-$id.out"
        [ "$(field "$r" "r['reversals']['late_never_reversed']")" -eq 0 ] || die "node $id: a late approval never reversed"
        [ "$(field "$r" "r['reversals']['duplicate_chains'] + r['reversals']['unreadable']")" -eq 0 ] \
            || die "node $id: a second chain for one original, or an unreadable F90: $(tail -1 "$r")"
        late=$((late + $(field "$r" "r['reversals']['late_approvals']")))
        # An answer the node sent in time that reached the switch past its
        # 500 ms (a starved box: two cores under CPU hogs) was declined at
        # the deadline, so its approval is rightly reversed.
        intime=$((intime + $(field "$r" "r['reversals']['chains_not_late']")))
        chains=$((chains + $(field "$r" "r['reversals']['chains']")))
        repeats=$((repeats + $(field "$r" "r['reversals']['repeats']")))
        ignored=$((ignored + $(field "$r" "r['advices']['ignored']")))
        arepeats=$((arepeats + $(field "$r" "r['advices']['repeats']")))
    done
    [ $((late + intime)) -eq "$OWED_REV" ] && [ "$chains" -eq "$OWED_REV" ] && [ "$repeats" -eq "$chains" ] \
        || die "nodes 04/05: late approvals $late (+ $intime late only at the switch), reversal chains $chains, repeats $repeats; A owed $OWED_REV"
    # Each advice: A's original ignored, one repeat acknowledged; a repeat
    # more only if an answer was lost (at least once).
    [ "$ignored" -eq "$OWED_ADV" ] && [ "$arepeats" -ge "$OWED_ADV" ] && [ "$arepeats" -le $((OWED_ADV + OWED_ADV / 10)) ] \
        || die "nodes 04/05: advices ignored $ignored, repeats $arepeats; A owed $OWED_ADV"
    log "the survivors delivered what A owed: $late late approvals (+ $intime late only at the switch) reversed ($chains chains, $repeats repeats), $OWED_ADV advices ($arepeats repeats)"
    SAF_LINE="; A owed $OWED_REV reversals + $OWED_ADV advices, the survivors delivered $delivered ($by)"
}

# psql against one of the store's servers (db: the first primary, db2: the
# standby), from the client namespace, over TLS (verify-full).
pg_query() {
    local psql
    psql=$(compgen -G "/usr/lib/postgresql/*/bin/psql" | tail -1)
    in_ns client env PGPASSWORD="$(cat "$WORK/pg/password")" "$psql" -qAt \
        "host=${IP[$1]} port=$PG_PORT user=isoswitch dbname=postgres sslmode=verify-full sslrootcert=$WORK/pg/tls/ca.crt connect_timeout=2" \
        -c "$2"
}

# One metric of switch $1 (the sum of its series matching $2, a regex).
metric() {
    in_ns "$1" curl -sf -m 2 "http://$ADMIN/metrics" | python3 -c "
import re, sys
pat = re.compile(sys.argv[1])
print(int(sum(float(l.rsplit(' ', 1)[1]) for l in sys.stdin if pat.match(l))))" "$2"
}

saf_nodes_connected() {
    [ "$(service_field "$1" saf "min(n['connections'] for n in s['nodes'])")" -ge 1 ]
}

# Nothing owed is left on the survivors: no reversal waiting for the store
# (in memory), none pending in it, none given up.
nothing_owed() {
    local h
    [ "$(saf_count "${SURVIVORS[0]}" pending)" -eq 0 ] || return 1
    for h in "${SURVIVORS[@]}"; do
        [ "$(metric "$h" '^isoswitch_reversals_awaiting_store\{')" -eq 0 ] || return 1
    done
}

# Phase 4: the primary database dies under load (kill -9 of everything in
# its namespace) while reversals are being stored; the standby is promoted a
# second later, as an operator's (or a monitor's) decision would. Checked:
# the common path did not wait (ATMs on the VIP: every request answered, none
# declined); every late approval before, during and after the switch-over
# is reversed at its node; each survivor's store reconnected by itself; the
# journal on the promoted server has every row committed 1 s before the kill
# (journal batches commit asynchronously: docs/ha.md).
db_failover() {
    local s=${SURVIVORS[0]} h id
    log "phase 4: the database fails over under load (kill -9 of the primary, the standby promoted)"
    # Nodes 04/05 again: late approvals, every reversal answered at once.
    for id in 04 05; do
        spawn "node-saf4-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:71${id}" --spec cup-pos --id "$id" \
            --delay 1ms..5ms --late-share 0.1 --late-by 1s --json
    done
    for h in "${SURVIVORS[@]}"; do
        wait_for 10 saf_nodes_connected "$h" || die "${h^^} did not connect to nodes 04/05 again"
    done
    [ "$(pg_query db2 "SELECT pg_is_in_recovery()")" = t ] || die "the standby is not in recovery"
    spawn nac-db client "$BIN" sim nac --connect "${IP[$s]}:7002" --uplinks 2 --terminals 20 \
        --rate 100 --duration 10s --json
    # The common path's latency: 3 s of ATMs before, then 6 s across the
    # kill and the promotion (same load).
    spawn atm-base client "$BIN" load --target "$VIP:7000" --spec cup-pos --clients 10 \
        --connection-per-request --mix 250 --duration 3s --timeout 3s --json --quiet
    wait_exit "$(pid_of atm-base)" 15 || die "the ATMs before the database failover did not finish"
    spawn atm-db client "$BIN" load --target "$VIP:7000" --spec cup-pos --clients 10 \
        --connection-per-request --mix 250 --duration 6s --timeout 3s --json --quiet
    local j_before t_kill t_promote t_back waiting pids
    sleep 1.5
    j_before=$(pg_query db "SELECT count(*) FROM journal") || die "cannot count the journal on the primary"
    sleep 1
    t_kill=$(now)
    pids=$(ip netns pids "$(ns db)")
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -9 $pids
    sleep 1
    waiting=0
    for h in "${SURVIVORS[@]}"; do
        waiting=$((waiting + $(metric "$h" '^isoswitch_reversals_awaiting_store\{' || echo 0)))
    done
    in_ns db2 scripts/pg-test.sh promote "$WORK/pg2" || die "the standby was not promoted"
    t_promote=$(now)
    for h in "${SURVIVORS[@]}"; do
        wait_for 20 saf_count "$h" pending || die "${h^^}'s store did not come back within 20 s of the promotion"
    done
    t_back=$(now)
    wait_exit "$(pid_of nac-db)" 30 || die "the NAC of phase 4 did not finish"
    wait_exit "$(pid_of atm-db)" 30 || die "the ATMs of phase 4 did not finish"
    local r="$WORK/atm-db.out" sent answered p99_base p99_db
    sent=$(field "$r" "r['requests']"); answered=$(field "$r" "r['answered']")
    p99_base=$(field "$WORK/atm-base.out" "f\"{r['latency_us']['p99'] / 1000:.1f}\"")
    p99_db=$(field "$r" "f\"{r['latency_us']['p99'] / 1000:.1f}\"")
    log "ATM through the database failover: sent $sent answered $answered declined $(field "$r" "r['declined']") timed out $(field "$r" "r['timeouts']"); p99 $p99_db ms (the 3 s before: $p99_base ms)"
    [ "$(field "$WORK/atm-base.out" "r['requests'] - r['answered']")" -eq 0 ] || die "ATM before the database failover: $(tail -1 "$WORK/atm-base.out")"
    [ "$sent" -gt 0 ] && [ "$answered" -eq "$sent" ] && [ "$(field "$r" "r['declined'] + r['mismatches']")" -eq 0 ] \
        || die "ATM: the common path waited on the store or failed during the database failover: $(tail -1 "$r")"
    r="$WORK/nac-db.out"
    [ "$(field "$r" "r['unanswered'] + r['mismatched'] + r['sent'] - r['answered'] - r['declined']")" -eq 0 ] \
        || die "NAC on ${s^^}'s saf service: $(tail -1 "$r")"
    # Late approvals come up to 1 s after the last answer; reversals that
    # waited for the store are retried with backoff (at most 5 s apart).
    local i settled=0
    for ((i = 0; i < 60; i++)); do
        if nothing_owed; then
            settled=$((settled + 1))
            [ $settled -ge 3 ] && break
        else
            settled=0
        fi
        sleep 0.5
    done
    [ $settled -ge 3 ] || die "reversals still owed 30 s after the database failover (pending: $(saf_rows "$s" pending))"
    local late=0 chains=0 dup=0 rep=0
    for id in 04 05; do
        kill -INT "$(pid_of "node-saf4-$id")"
        wait_exit "$(pid_of "node-saf4-$id")" 20 || die "node $id did not stop"
        r="$WORK/node-saf4-$id.out"
        [ "$(field "$r" "r['reversals']['late_never_reversed']")" -eq 0 ] \
            || die "node $id: a late approval never reversed across the database failover: $(tail -1 "$r")"
        [ "$(field "$r" "r['reversals']['unreadable']")" -eq 0 ] \
            || die "node $id: an unreadable F90: $(tail -1 "$r")"
        late=$((late + $(field "$r" "r['reversals']['late_approvals']")))
        chains=$((chains + $(field "$r" "r['reversals']['chains']")))
        dup=$((dup + $(field "$r" "r['reversals']['duplicate_chains']")))
        rep=$((rep + $(field "$r" "r['reversals']['repeats']")))
    done
    [ "$late" -gt 0 ] || die "no late approval during phase 4"
    local unrev=0
    for h in "${SURVIVORS[@]}"; do
        unrev=$((unrev + $(service_field "$h" saf "s['integrity']['late_unreversed']")))
    done
    [ "$unrev" -eq 0 ] || die "the survivors gave up $unrev reversals"
    local j_after failed=0
    j_after=$(pg_query db2 "SELECT count(*) FROM journal") || die "cannot count the journal on the promoted standby"
    [ "$j_after" -ge "$j_before" ] || die "the journal lost rows in the failover: $j_before before, $j_after after"
    for h in "${SURVIVORS[@]}"; do
        failed=$((failed + $(metric "$h" '^isoswitch_journal_failed_total')))
    done
    log "database failover: store back on every survivor $(since "$t_kill" "$t_back") s after the kill ($(since "$t_promote" "$t_back") s after the promotion); $waiting reversals waited for the store at the promotion; nodes: $late late approvals, $chains reversal chains ($dup second chains, $rep repeats: at least once); journal $j_before rows 1 s before the kill, $j_after after ($failed rows not written during the outage, counted)"
    DB_LINE="; database failover: store back $(since "$t_kill" "$t_back") s after the kill, $late late approvals all reversed ($waiting waited for the store), ATM $answered/$sent p99 $p99_db ms (before: $p99_base), journal $j_before -> $j_after ($failed unwritten)"
}

check_unionpay() {
    local tag=$1 cups="$WORK/$2.out" node="$WORK/node-cups-03-$1.out"
    local sent answered mism unans orig oans foreign elsewhere
    sent=$(field "$cups" "r['sent']"); answered=$(field "$cups" "r['answered']")
    mism=$(field "$cups" "r['mismatched']"); unans=$(field "$cups" "r['unanswered']")
    orig=$(field "$node" "r['originated']"); oans=$(field "$node" "r['originated_answered']")
    foreign=$(field "$node" "r['foreign_responses']"); elsewhere=$(field "$node" "r['originated_answered_elsewhere']")
    log "UnionPay $tag: issuer sent $sent answered $answered mismatched $mism unanswered $unans unsigned $(field "$cups" "r['unsigned_frames']") crossed $(field "$cups" "r['crossed']")"
    log "node 03 $tag: originated $orig answered $oans foreign $foreign on-another-connection $elsewhere"
    [ "$sent" -gt 0 ] && [ "$answered" -eq "$sent" ] && [ "$mism" -eq 0 ] && [ "$unans" -eq 0 ] \
        || die "UnionPay $tag: every issuer request answered exactly once"
    [ "$(field "$cups" "r['unsigned_frames']")" -eq 0 ] || die "UnionPay $tag: frames on unsigned out links"
    [ "$orig" -gt 0 ] && [ "$oans" -eq "$orig" ] && [ "$foreign" -eq 0 ] \
        || die "UnionPay $tag: every node-originated request answered exactly once, to its node"
    UP_LINE="$UP_LINE $tag: issuer $answered/$sent, node $oans/$orig;"
}

run_test() {
    local t0 t_kill t_vip t_first
    t0=$(now)
    trap 'rc=$?; [ $rc -eq 0 ] || { log "logs in $WORK"; }; down_quiet; exit $rc' EXIT
    up
    UP_LINE=""

    log "phase 1: UnionPay across ${SWITCHES_ALL[*]^^} (links ${SHARE[*]})"
    SWITCHES=("${SWITCHES_ALL[@]}")
    start_cups cups-1 "${SWITCHES[@]}"
    unionpay_round both 6 cups-1
    check_unionpay both cups-1
    # Every instance's out links had answers on another's in links, and
    # every instance's in links carried answers to another's requests.
    local crossed h ips=()
    for h in "${SWITCHES[@]}"; do ips+=("${IP[$h]}"); done
    crossed=$(field "$WORK/cups-1.out" "' '.join(f\"{k}={v}\" for k, v in sorted(r['crossed'].items()))")
    python3 -c "
import sys
crossed = dict((k, int(v)) for k, v in (x.split('=') for x in sys.argv[1].split()))
for ip in sys.argv[2:]:
    out = sum(v for k, v in crossed.items() if k.startswith(ip + '->'))
    into = sum(v for k, v in crossed.items() if k.endswith('->' + ip))
    if out == 0 or into == 0:
        sys.exit(f'{ip}: {out} answers from its out links on another in link, {into} into its in links')" "$crossed" "${ips[@]}" \
        || die "UnionPay's answers did not cross every way between the instances ($crossed)"
    [ "$(field "$WORK/node-cups-03-both.out" "r['originated_answered_elsewhere']")" -gt 0 ] \
        || die "node 03 got no answer on another connection than its request's"
    log "F37 across instances (out -> in): $crossed"

    log "phase 2: reversals owed through A, then ATMs ($ATM_CLIENTS) and a NAC on the VIP, kill -9 of switch A"
    owe_through_a
    spawn atm client "$BIN" load --target "$VIP:7000" --spec cup-pos --clients "$ATM_CLIENTS" \
        --connection-per-request --mix 250 --duration 10s --timeout 3s --json --quiet
    nac_through_failover "$(($(date +%s) + 10))" &
    echo $! >"$WORK/pids/nac-loop"
    disown $!
    # The clients' view of the VIP: a connect every 20 ms (200 ms timeout),
    # each change of outcome with its time.
    spawn probe client python3 -c "
import socket, sys, time
last = None
end = time.time() + 12
while time.time() < end:
    s = socket.socket(); s.settimeout(0.2)
    try:
        s.connect(('$VIP', 7000)); r = 'ok'
    except OSError as e:
        r = type(e).__name__
    s.close()
    if r != last:
        print(f'{time.time():.3f} {r}', flush=True); last = r
    time.sleep(0.02)"
    sleep 3
    t_kill=$(now)
    kill -9 "$(pid_of switch-a)"
    wait_for 15 has_vip b || die "the VIP did not move to B within 15 s"
    t_vip=$(now)
    has_vip a && die "the VIP is still on A"
    wait_exit "$(pid_of probe)" 15 || die "the VIP probe did not end"
    # Service is back at the first successful connect after the first failure
    # following the kill.
    t_first=$(python3 -c "
import sys
kill = float(sys.argv[1]); failed = False
for line in open(sys.argv[2]):
    t, r = line.split(); t = float(t)
    if t < kill: continue
    if r != 'ok': failed = True
    elif failed: print(t); break
else: sys.exit('no connect to the VIP succeeded after the kill')" "$t_kill" "$WORK/probe.out") \
        || die "the VIP answered no connect after the kill (probe: $(tr '\n' ' ' <"$WORK/probe.out"))"
    wait_exit "$(pid_of atm)" 30 || true
    [ -s "$WORK/atm.out" ] || { cat "$WORK/atm.log" >&2; die "the ATM load printed no report"; }
    local r="$WORK/atm.out" sent answered declined timeouts lost mism
    sent=$(field "$r" "r['requests']"); answered=$(field "$r" "r['answered']")
    declined=$(field "$r" "r['declined']"); timeouts=$(field "$r" "r['timeouts']")
    lost=$(field "$r" "r['connections_lost'] + r['timeouts']"); mism=$(field "$r" "r['mismatches']")
    log "ATM: sent $sent answered $answered declined $declined lost-with-A $lost (closed $(field "$r" "r['connections_lost']"), timed out $timeouts) doubled/mismatched $mism connect failures $(field "$r" "r['connect_failures']")"
    [ "$mism" -eq 0 ] || die "ATM: $mism answers doubled or mismatched"
    [ "$declined" -eq 0 ] || die "ATM: $declined declined"
    # An ATM client has one request in flight; when A dies it can lose that
    # one and at most one more, sent on a connection A's kernel completed in
    # the listen backlog while the process was being torn down (all of the
    # backlog is reset at once when the listener closes). After that a
    # connect to the VIP is refused (A) or served (B): nothing else is lost.
    [ "$lost" -le $((2 * ATM_CLIENTS)) ] || die "ATM: $lost lost, more than the $((2 * ATM_CLIENTS)) that can be in flight at the kill"
    [ "$answered" -eq $((sent - lost)) ] || die "ATM: answered $answered != sent $sent - lost $lost"
    wait_exit "$(pid_of nac-loop)" 30 || die "the NAC runs did not end within 30 s"
    local nac_line
    nac_line=$(python3 -c "
import glob, json, sys
runs = []
for f in sorted(glob.glob(sys.argv[1] + '/nac-f*.out')):
    lines = open(f).read().split()
    if lines:
        runs.append(json.loads(lines[-1]))
t = {k: sum(r[k] for r in runs) for k in ('sent', 'answered', 'declined', 'mismatched', 'unanswered')}
print(len(runs), t['sent'], t['answered'], t['declined'], t['mismatched'], t['unanswered'], runs[-1]['answered'] if runs else 0)" "$WORK")
    local fruns fsent fans fdecl fmism funans flast
    read -r fruns fsent fans fdecl fmism funans flast <<<"$nac_line"
    log "NAC through the failover: $fruns runs, sent $fsent answered $fans declined $fdecl unanswered $funans doubled/mismatched $fmism; last run answered $flast"
    [ "$fmism" -eq 0 ] || die "NAC: $fmism answers doubled or mismatched"
    [ "$fdecl" -eq 0 ] || die "NAC: $fdecl declined"
    [ "$fruns" -ge 2 ] && [ "$flast" -gt 0 ] || die "NAC: no run through B after the failover"
    # A terminal keeps one request in flight; on a dead uplink it loses that
    # one, and the one or two it sends before its writer sees the socket
    # fail (a write after the peer's FIN succeeds until the RST comes back).
    [ "$funans" -le 60 ] || die "NAC: $funans unanswered, more than 3 per terminal"
    [ "$fans" -eq $((fsent - funans)) ] || die "NAC: answered $fans != sent $fsent - lost $funans"
    local b_after
    b_after=$(service_field b atm "s['answered']")
    [ "$b_after" -gt 0 ] || die "B answered no ATM request"
    log "failover: VIP on B $(since "$t_kill" "$t_vip") s after the kill, clients connected again after $(since "$t_kill" "$t_first") s; B answered $b_after ATM requests"

    log "phase 3: the survivors (${SURVIVORS[*]^^}) alone"
    SWITCHES=("${SURVIVORS[@]}")
    start_cups cups-3 "${SWITCHES[@]}"
    local signed
    for h in "${SWITCHES[@]}"; do
        signed=$(service_field "$h" unionpay "s['links']['signed_on']")
        [ "$signed" -eq "${SHARE[$h]}" ] || die "${h^^} has $signed of ${SHARE[$h]} out links signed on"
    done
    unionpay_round alone 6 cups-3
    check_unionpay alone cups-3
    [ "$(field "$WORK/cups-3.out" "sum(v for k, v in r['crossed'].items() if '${IP[a]}' in k.split('->'))")" -eq 0 ] \
        || die "an answer crossed through A, dead"
    spawn nac client "$BIN" sim nac --connect "$VIP:7001" --uplinks 2 --terminals 20 --rate 200 --duration 3s --json
    wait_exit "$(pid_of nac)" 20 || die "the NAC did not finish"
    local nsent nans
    nsent=$(field "$WORK/nac.out" "r['sent']"); nans=$(field "$WORK/nac.out" "r['answered']")
    log "NAC on the VIP (B): sent $nsent answered $nans mismatched $(field "$WORK/nac.out" "r['mismatched']")"
    [ "$nsent" -gt 0 ] && [ "$nans" -eq "$nsent" ] || die "NAC through B: not every request answered"

    b_delivers_what_a_owed

    db_failover

    log "all phases passed in $(since "$t0" "$(now)") s"
    echo "ha: $INSTANCES instances; failover $(since "$t_kill" "$t_first") s (VIP on B after $(since "$t_kill" "$t_vip") s); ATM sent $sent answered $answered (through B $b_after) lost-with-A $lost doubled $mism; NAC sent $fsent answered $fans lost-with-A $funans doubled $fmism; UnionPay$UP_LINE survivors ${SURVIVORS[*]^^} with their links signed on$SAF_LINE$DB_LINE"
}

case "${1:-}" in
    up) need_root_and_tools; up; log "rig up; scripts/ha-rig.sh down to remove it" ;;
    test) need_root_and_tools; run_test ;;
    down) down ;;
    *) echo "usage: $0 up|test|down" >&2; exit 2 ;;
esac
