# Sourced by scripts/checks/tls.sh and scripts/checks/monitoring.sh (this
# file only defines functions; it sets no trap: the caller kills TLS_PIDS and
# removes its directory). Makes a CA and certificates with openssl in a
# temporary directory (no private key lives in the repository), and starts
# a switch with mutual TLS on its listen front and HTTPS on its admin API,
# in front of one simulated node.

# tls_pki DIR: DIR/ca.pem, DIR/switch.{pem,key} (127.0.0.1, switch.check)
# and DIR/client.{pem,key} (nac-check), valid for 2 days.
tls_pki() {
    local dir=$1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" -subj /CN=tls-check-ca -days 2 \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
    tls_leaf "$dir" switch switch.check "IP:127.0.0.1,DNS:switch.check"
    tls_leaf "$dir" client nac-check "DNS:nac-check"
}

tls_leaf() {
    local dir=$1 name=$2 cn=$3 san=$4
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$cn" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" \
        > "$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 2 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
}

tls_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# tls_switch BIN DIR: the switch and its node, TLS_FRONT and TLS_ADMIN set,
# their PIDs in TLS_PIDS; returns once the admin answers over HTTPS.
tls_switch() {
    local bin=$1 dir=$2 node
    TLS_FRONT=127.0.0.1:$(tls_free_port)
    TLS_ADMIN=127.0.0.1:$(tls_free_port)
    node=127.0.0.1:$(tls_free_port)
    TLS_PIDS=()
    cat > "$dir/switch.toml" <<TOML
[admin]
listen = "$TLS_ADMIN"
[admin.tls]
cert = "$dir/switch.pem"
key = "$dir/switch.key"
[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "$TLS_FRONT"
[service.front.tls]
cert = "$dir/switch.pem"
key = "$dir/switch.key"
client_ca = "$dir/ca.pem"
client_names = ["nac-check"]
[service.back]
[[service.back.node]]
id = "01"
address = "$node"
TOML
    "$bin" sim node --listen "$node" --spec cup-pos --id 01 2>>"$dir/node.log" &
    TLS_PIDS+=($!)
    ISOSWITCH_ADMIN_TOKEN=check-token-0123456789abcdef \
        "$bin" run --config "$dir/switch.toml" --data-dir "$dir/data" 2>"$dir/switch.log" &
    TLS_PIDS+=($!)
    for _ in $(seq 100); do
        "$bin" ctl --admin "https://$TLS_ADMIN" --tls-ca "$dir/ca.pem" health >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat "$dir/switch.log"
    echo "FAIL: the TLS switch did not start"
    return 1
}
