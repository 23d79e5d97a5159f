# The switch-and-three-nodes rig the measuring scripts share
# (perf-profile.sh, bench-syscalls.sh, bench-client-memory.sh,
# bench-capture.sh, bench-journal.sh, bench-per-core.sh). Source it from
# the repository's root.

# rig_binary: sets `bin` to $ISOSWITCH_BIN, or builds this tree's binary
# with the production profile (what ships is what is measured: Cargo.toml)
# and points at it.
rig_binary() {
    bin=${ISOSWITCH_BIN:-}
    if [ -z "$bin" ]; then
        cargo build --profile production --quiet --bin isoswitch
        bin="${CARGO_TARGET_DIR:-target}/production/isoswitch"
    fi
}

# rig_start: a work directory (`work`), the processes to stop (`pids`), and
# the exit trap that stops them. It waits for them too: a switch still
# exiting holds the port the next run (an A/B of two builds back to back)
# must bind.
rig_start() {
    work=$(mktemp -d)
    pids=()
    trap rig_cleanup EXIT
}

rig_cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}

# rig_nodes BASE SPEC [CPU]: three `sim node`s on 127.0.0.1:BASE+1..3,
# pinned to CPU when given.
rig_nodes() {
    local base=$1 spec=$2 cpu=${3:-}
    local pin=()
    [ -n "$cpu" ] && pin=(taskset -c "$cpu")
    for i in 1 2 3; do
        "${pin[@]}" "$bin" sim node --listen 127.0.0.1:$((base + i)) --spec "$spec" --id 0$i >/dev/null 2>&1 &
        pids+=($!)
    done
}

# rig_switch_toml BASE SPEC CLIENTS IN_FLIGHT: a listen front on BASE for
# CLIENTS terminals (each with IN_FLIGHT requests at most), two links to
# each of the three nodes, on stdout.
rig_switch_toml() {
    local base=$1 spec=$2 clients=$3 in_flight=$4
    printf '[[service]]\nname = "rig"\nspec = "%s"\n[service.front]\nkind = "listen"\n' "$spec"
    printf 'listen = "127.0.0.1:%s"\nmax_connections = %s\nmax_per_source = %s\n' "$base" $((clients + 100)) $((clients + 100))
    printf 'max_in_flight_per_source = %s\n' $((clients * in_flight + 1000))
    printf '[service.back]\nconnections_per_node = 2\n[service.back.health]\ncheck = "tcp"\n'
    for i in 1 2 3; do
        printf '[[service.back.node]]\nid = "0%s"\naddress = "127.0.0.1:%s"\n' "$i" $((base + i))
    done
}
