# Sourced by the ops checks (scripts/test.sh runs only scripts/checks/*.sh;
# this file only defines functions). Starts three simulated channel nodes,
# a switch with its admin listener and a NAC load on free 127.0.0.1 ports, and
# cleans up on exit.

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# SERVICE (default pos) and NODE_IDS (default "01 02 03") name the service
# and its nodes.
start_switch() {
    SERVICE=${SERVICE:-pos}
    NODE_IDS=${NODE_IDS:-01 02 03}
    cargo build --locked --quiet
    BIN="${CARGO_TARGET_DIR:-target}/debug/isoswitch"
    WORK=$(mktemp -d)
    PIDS=()
    trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
    FRONT=127.0.0.1:$(free_port)
    ADMIN=127.0.0.1:$(free_port)
    export ISOSWITCH_ADMIN_TOKEN=check-token-0123456789abcdef
    {
        # The status page is read-only: open it like the probes, so a browser
        # can load it without a header.
        printf '[admin]\nlisten = "%s"\nopen_paths = ["/healthz", "/readyz", "/metrics", "/"]\n' "$ADMIN"
        printf '[[service]]\nname = "%s"\nspec = "cup-pos"\n' "$SERVICE"
        printf '[service.front]\nkind = "listen"\nlisten = "%s"\n[service.back]\n' "$FRONT"
    } > "$WORK/switch.toml"
    for id in $NODE_IDS; do
        local port
        port=$(free_port)
        "$BIN" sim node --listen "127.0.0.1:$port" --spec cup-pos --id "$id" --delay 1ms..5ms 2>>"$WORK/nodes.log" &
        PIDS+=($!)
        printf '[[service.back.node]]\nid = "%s"\naddress = "127.0.0.1:%s"\n' "$id" "$port" >> "$WORK/switch.toml"
    done
    "$BIN" run --config "$WORK/switch.toml" --data-dir "$WORK/data" 2>"$WORK/switch.log" &
    PIDS+=($!)
    for _ in $(seq 100); do
        curl -sf "http://$ADMIN/healthz" >/dev/null 2>&1 && break
        sleep 0.1
    done
    curl -sf "http://$ADMIN/healthz" >/dev/null || { cat "$WORK/switch.log"; echo "FAIL: the switch did not start"; exit 1; }
    for _ in $(seq 100); do
        curl -sf "http://$ADMIN/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
}

nac_load() {
    "$BIN" sim nac --connect "$FRONT" --uplinks 2 --terminals 20 --rate 200 --duration "$1" >"$WORK/nac.out" 2>&1
}
