#!/usr/bin/env bash
# Two isoswitch instances behind one virtual IP held by keepalived (VRRP), in
# network namespaces this script creates: nothing on the host is touched.
#
#   scripts/ha-rig.sh up     build the rig and leave it running
#   scripts/ha-rig.sh test   up, then the three phases below, then down; the
#                            last line gives the failover time and the counts
#   scripts/ha-rig.sh down   stop everything the rig started, delete its
#                            namespaces (safe after a failed or partial run)
#
# Namespaces (prefix $HA_PREFIX, default isoha), all on one bridge that lives
# in its own namespace (<p>-lan), 10.209.0.0/24:
#   <p>-client .10   ATMs (isoswitch load --connection-per-request), a NAC
#   <p>-a      .11   isoswitch A + keepalived (priority 150: master)
#   <p>-b      .12   isoswitch B + keepalived (priority 100: backup)
#   <p>-nodes  .20   channel nodes (sim node): POS 01 02, UnionPay 01 02 03
#   <p>-cups   .30   UnionPay (sim cups): 8 in links, 4 to A and 4 to B
#   <p>-db     .40   PostgreSQL: the store both instances share (SAF queue)
#   virtual IP .100  the clients' address of the switch (VRRP)
#
# Phases of `test`:
#   1. UnionPay across both instances: UnionPay's issuer requests and node 03's
#      acquirer requests both ways; every answer exactly once, answers crossing
#      from A's out links to B's in links and back (routed by F37 alone).
#   2. Failover under load: ATMs on the VIP, kill -9 of switch A; keepalived's
#      health script fails, B takes the VIP; answered = sent - lost, lost <=
#      the requests that can be in flight (one per ATM), nothing doubled.
#   3. B alone: its 4 out + 4 in links signed on, UnionPay both ways and a NAC
#      on the VIP, every request answered.
#   Across 2 and 3, what A owed: before the kill, a NAC on A's own address
#   gets late approvals from the `saf` service's nodes (04, 05), which ignore
#   the first message of each reversal chain, so A stores the reversals in
#   the shared PostgreSQL store and cannot deliver them before it dies. B
#   delivers every one (0421 repeats), once each, to the node that approved.
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
declare -A IP=([client]=$NET.10 [a]=$NET.11 [b]=$NET.12 [nodes]=$NET.20 [cups]=$NET.30 [db]=$NET.40)
HOSTS=(client a b nodes cups db)
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
# isoswitch $me of the HA rig: identical on both instances but for nothing:
# the same node ids (so the F37 stamp of a node is the same on A and B), the
# same listen ports (the VIP lands on either), half of UnionPay's link set,
# one store (what A owes, B delivers).
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
links = 4
max_in_links = 4
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
        $( [ "$me" = a ] && echo "${IP[b]}" || echo "${IP[a]}" )
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

    log "PostgreSQL (the shared store) on ${IP[db]}"
    rm -rf "$WORK/pg"
    STORE_URL=$(in_ns db scripts/pg-test.sh start "$WORK/pg" 5432 "${IP[db]}" "$NET.0/24") \
        || die "PostgreSQL did not start in $(ns db)"

    log "the store's data key (both instances seal with it)"
    rm -f "$WORK/store.key"
    (umask 077; printf '1 %s\n' "$(python3 -c 'import secrets; print(secrets.token_hex(32))')" >"$WORK/store.key")

    log "channel nodes"
    for id in 01 02; do
        spawn "node-pos-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:71${id}" --spec cup-pos --id "$id" --delay 1ms..5ms --json
        spawn "node-cups-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:72${id}" --spec cups --id "$id" --delay 1ms..5ms --json
    done
    # The saf service's hosts: a tenth of approvals a second late (past the
    # switch's 500 ms), the first message of each reversal chain unanswered.
    for id in 04 05; do
        spawn "node-saf-$id" nodes "$BIN" sim node --listen "${IP[nodes]}:71${id}" --spec cup-pos --id "$id" \
            --delay 1ms..5ms --late-share 0.1 --late-by 1s --ignore-reversals 1 --json
    done
    wait_for 10 in_ns client python3 -c "import socket; socket.create_connection(('${IP[nodes]}', 7101), 1)" \
        || die "the bridge does not carry traffic (client -> nodes)"

    log "isoswitch A and B"
    for h in a b; do
        switch_config "$h" >"$WORK/switch-$h.toml"
        # A data directory each: A and B share this filesystem, not their state.
        rm -rf "$WORK/data-$h"
        spawn "switch-$h" "$h" env ISOSWITCH_LOG=warn "$BIN" run --config "$WORK/switch-$h.toml" --data-dir "$WORK/data-$h"
    done
    for h in a b; do
        wait_for 20 in_ns "$h" curl -sf -m 1 "http://$ADMIN/healthz" \
            || { tail -20 "$WORK/switch-$h.log" >&2; die "switch $h did not start"; }
    done

    log "keepalived (VRRP) in A (150) and B (100)"
    keepalived_config a 150 >"$WORK/keepalived-a.conf"
    keepalived_config b 100 >"$WORK/keepalived-b.conf"
    for h in a b; do
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
    has_vip b && die "the VIP is on both A and B"
    log "VIP $VIP is on A"
}

# Stops every process in the rig's namespaces (they are all the rig's own),
# then deletes the namespaces: the veths and the bridge go with them.
down_quiet() {
    local h pids
    # The store first, gently: a server killed with -9 can leave its shared
    # memory behind.
    [ ! -d "$WORK/pg/data" ] || scripts/pg-test.sh halt "$WORK/pg" >/dev/null 2>&1 || true
    for h in client a b nodes cups db lan; do
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
    for h in client a b nodes cups db lan; do
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
    local name=$1; shift
    spawn "$name" cups "$BIN" sim cups --accept "${IP[cups]}:9001" \
        --connect "${IP[a]}:9101" --also-connect "${IP[b]}:9101" --links 8 \
        --rate 40 --duration 120s --require-sign-on --json
    for h in "$@"; do
        wait_for 20 ready "$h" || { api "$h" /api/v1/status >&2 || true; die "switch $h not ready with UnionPay up"; }
        wait_for 20 links_ready "$h" 4 || { api "$h" /api/v1/status >&2 || true; die "switch $h: not 4 in links and every out link signed on"; }
    done
}

# Runs UnionPay node 03 with node-originated requests for $2 seconds, then
# stops it (Ctrl-C: stops originating, waits for the answers) and stops
# UnionPay; both reports are in $WORK.
unionpay_round() {
    local tag=$1 seconds=$2 cups=$3
    # Node 03 originates only once every live switch holds connections to it:
    # an answer that lands on an instance without one could not be routed.
    spawn "node-cups-03-$tag" nodes "$BIN" sim node --listen "${IP[nodes]}:7203" --spec cups --id 03 \
        --delay 1ms..5ms --originate 40 --originate-after 3s --json
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
    spawn nac-saf client "$BIN" sim nac --connect "${IP[a]}:7002" --uplinks 2 --terminals 20 \
        --rate 100 --duration 2s --json
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
    [ "$(saf_count a delivered)" -eq 0 ] || die "A delivered a reversal before its kill: the rig's timing is off"
    OWED=$n
    log "A owes $OWED reversals (late approvals of $sent requests), stored in PostgreSQL"
}

# After the kill: B delivers every reversal A stored, once each, to the node
# that approved, as a repeat (0421); the nodes' books agree.
b_delivers_what_a_owed() {
    local b_name delivered=0 i
    b_name=$(cat "$WORK/data-b/instance-name")
    # A's next attempts were due 20 s after its first: bounded well past it.
    for ((i = 0; i < 80; i++)); do
        delivered=$(saf_count b delivered) || delivered=0
        [ "$delivered" -ge "$OWED" ] && break
        sleep 0.5
    done
    [ "$delivered" -eq "$OWED" ] || die "B delivered $delivered of the $OWED reversals A owed (pending: $(saf_rows b pending))"
    [ "$(saf_count b pending)" -eq 0 ] || die "reversals still owed after B delivered $delivered"
    saf_rows b delivered | python3 -c "
import json, sys
rows = json.load(sys.stdin)
bad = [r for r in rows if r['kind'] != 'reversal' or r.get('completed_by') != sys.argv[1] or r['attempts'] < 2]
sys.exit(f'not delivered by B ({sys.argv[1]}) as a repeat: {bad}' if bad else 0)" "$b_name" \
        || die "B did not deliver every reversal itself"
    local id late=0 chains=0 repeats=0 r
    for id in 04 05; do
        kill -INT "$(pid_of "node-saf-$id")"
        wait_exit "$(pid_of "node-saf-$id")" 20 || die "node $id did not stop"
        r="$WORK/node-saf-$id.out"
        [ "$(field "$r" "r['reversals']['late_never_reversed']")" -eq 0 ] || die "node $id: a late approval never reversed"
        [ "$(field "$r" "r['reversals']['chains_not_late'] + r['reversals']['duplicate_chains'] + r['reversals']['unreadable']")" -eq 0 ] \
            || die "node $id: a reversal for an answer in time, a second chain for one original, or an unreadable F90: $(tail -1 "$r")"
        late=$((late + $(field "$r" "r['reversals']['late_approvals']")))
        chains=$((chains + $(field "$r" "r['reversals']['chains']")))
        repeats=$((repeats + $(field "$r" "r['reversals']['repeats']")))
    done
    [ "$late" -eq "$OWED" ] && [ "$chains" -eq "$late" ] && [ "$repeats" -eq "$chains" ] \
        || die "nodes 04/05: late approvals $late, reversal chains $chains, repeats $repeats; A owed $OWED"
    log "B delivered the $OWED reversals A owed: nodes 04/05 saw $late late approvals, $chains chains, $repeats repeats"
    SAF_LINE="; A owed $OWED reversals, B delivered $delivered"
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

    log "phase 1: UnionPay across A and B"
    SWITCHES=(a b)
    start_cups cups-1 a b
    unionpay_round both 6 cups-1
    check_unionpay both cups-1
    local a_to_b b_to_a
    a_to_b=$(field "$WORK/cups-1.out" "r['crossed'].get('${IP[a]}->${IP[b]}', 0)")
    b_to_a=$(field "$WORK/cups-1.out" "r['crossed'].get('${IP[b]}->${IP[a]}', 0)")
    [ "$a_to_b" -gt 0 ] && [ "$b_to_a" -gt 0 ] \
        || die "UnionPay answered no request from A's out links on B's in links, or none from B's on A's ($a_to_b, $b_to_a)"
    [ "$(field "$WORK/node-cups-03-both.out" "r['originated_answered_elsewhere']")" -gt 0 ] \
        || die "node 03 got no answer on another connection than its request's"
    log "F37 across instances: $a_to_b answers A-out -> B-in, $b_to_a answers B-out -> A-in"

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

    log "phase 3: B alone"
    SWITCHES=(b)
    start_cups cups-3 b
    local signed
    signed=$(service_field b unionpay "s['links']['signed_on']")
    [ "$signed" -eq 4 ] || die "B has $signed of 4 out links signed on"
    unionpay_round alone 6 cups-3
    check_unionpay alone cups-3
    [ "$(field "$WORK/cups-3.out" "sum(r['crossed'].values())")" -eq 0 ] || die "an answer crossed with A dead"
    spawn nac client "$BIN" sim nac --connect "$VIP:7001" --uplinks 2 --terminals 20 --rate 200 --duration 3s --json
    wait_exit "$(pid_of nac)" 20 || die "the NAC did not finish"
    local nsent nans
    nsent=$(field "$WORK/nac.out" "r['sent']"); nans=$(field "$WORK/nac.out" "r['answered']")
    log "NAC on the VIP (B): sent $nsent answered $nans mismatched $(field "$WORK/nac.out" "r['mismatched']")"
    [ "$nsent" -gt 0 ] && [ "$nans" -eq "$nsent" ] || die "NAC through B: not every request answered"

    b_delivers_what_a_owed

    log "all phases passed in $(since "$t0" "$(now)") s"
    echo "ha: failover $(since "$t_kill" "$t_first") s (VIP on B after $(since "$t_kill" "$t_vip") s); ATM sent $sent answered $answered (through B $b_after) lost-with-A $lost doubled $mism; NAC sent $fsent answered $fans lost-with-A $funans doubled $fmism; UnionPay$UP_LINE B alone with 4+4 links signed on$SAF_LINE"
}

case "${1:-}" in
    up) need_root_and_tools; up; log "rig up; scripts/ha-rig.sh down to remove it" ;;
    test) need_root_and_tools; run_test ;;
    down) down ;;
    *) echo "usage: $0 up|test|down" >&2; exit 2 ;;
esac
