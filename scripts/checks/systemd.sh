#!/usr/bin/env bash
# The systemd unit, deploy/isoswitch.service, checked two ways:
#
# 1. `systemd-analyze verify`: the unit parses and every key is known (any
#    warning fails). The binary it names is the one built here, laid over
#    /usr/bin (an overlay in a private mount namespace): nothing is installed.
#    Its man page comes with the package: scripts/checks/package.sh verifies
#    the installed unit with it.
# 2. Under a real systemd: a container (systemd-nspawn) boots this machine's
#    own root through a throwaway overlay (every write goes to a tmpfs) with
#    the unit installed, a user `isoswitch`, a root-only token in
#    /etc/isoswitch/admin-token and a config without token_file. A probe unit
#    inside starts isoswitch.service and checks: it runs as `isoswitch`, the
#    admin API takes the token (read from the LoadCredential= credential),
#    /var/lib/isoswitch is 0700, a drain through the API is saved there (0600)
#    and survives `systemctl reload` and `systemctl restart`.
#
# Needs root (mount namespaces, overlayfs, nspawn) and the tools listed in
# scripts/deps/systemd.apt. Fails, never skips, saying what is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL systemd.sh: $*"
    exit 1
}

UNIT=deploy/isoswitch.service

# Inside the private mount namespace: boot the container and probe the unit.
# $1 = scratch directory, $2 = the isoswitch binary.
boot_and_probe() {
    local work=$1 bin=$2
    # nspawn keeps its own state under /run and wants it on a tmpfs.
    mount -t tmpfs tmpfs /run
    mkdir -p "$work/ns"
    mount -t tmpfs tmpfs "$work/ns"
    mkdir -p "$work/ns/upper" "$work/ns/work" "$work/ns/root"
    mount -t overlay overlay \
        -o "lowerdir=/,upperdir=$work/ns/upper,workdir=$work/ns/work" "$work/ns/root"
    local root=$work/ns/root
    systemd-id128 new >"$root/etc/machine-id"
    install -m 0755 "$bin" "$root/usr/bin/isoswitch"
    install -m 0644 "$UNIT" "$root/etc/systemd/system/isoswitch.service"
    useradd -R "$root" --system --no-create-home --shell /usr/sbin/nologin isoswitch
    mkdir -p "$root/etc/isoswitch"
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$root/etc/isoswitch/admin-token"
    chmod 0600 "$root/etc/isoswitch/admin-token"
    cat >"$root/etc/isoswitch/isoswitch.toml" <<'TOML'
[admin]
listen = "127.0.0.1:9090"
[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "127.0.0.1:6000"
[service.back]
[[service.back.node]]
id = "01"
address = "127.0.0.1:7001"
[[service.back.node]]
id = "02"
address = "127.0.0.1:7002"
TOML
    chgrp "$(grep '^isoswitch:' "$root/etc/group" | cut -d: -f3)" "$root/etc/isoswitch/isoswitch.toml"
    chmod 0640 "$root/etc/isoswitch/isoswitch.toml"
    cat >"$root/usr/local/bin/isoswitch-probe" <<'PROBE'
#!/bin/sh
set -eu
token=$(cat /etc/isoswitch/admin-token)
api() { curl -sf -H "Authorization: Bearer $token" "$@"; }
status() { api http://127.0.0.1:9090/api/v1/status; }
admin_of_02() { status | grep -o '"id":"02"[^}]*' | grep -o '"admin":"[a-z]*"'; }
fail() { echo "FAIL: $*"; systemctl status --no-pager isoswitch || true; journalctl --no-pager -u isoswitch | tail -20; exit 1; }
up() { for _ in $(seq 100); do status >/dev/null 2>&1 && return 0; sleep 0.1; done; fail "the admin API did not answer"; }
isoswitch sim node --listen 127.0.0.1:7001 --spec cup-pos --id 01 >/dev/null 2>&1 &
isoswitch sim node --listen 127.0.0.1:7002 --spec cup-pos --id 02 >/dev/null 2>&1 &
systemctl start isoswitch
up
echo "ok: isoswitch.service started; the admin API takes the token from its credential"
user=$(ps -o user= -p "$(systemctl show -p MainPID --value isoswitch)")
[ "$user" = isoswitch ] || fail "runs as $user, not isoswitch"
echo "ok: runs as user isoswitch"
[ "$(stat -c '%U %a' /var/lib/isoswitch)" = "isoswitch 700" ] || fail "/var/lib/isoswitch: $(stat -c '%U %a' /var/lib/isoswitch)"
api -X POST -H "Content-Type: application/json" http://127.0.0.1:9090/api/v1/services/pos/nodes/02/drain >/dev/null || fail "drain refused"
[ "$(stat -c '%U %a' /var/lib/isoswitch/runtime-state.json)" = "isoswitch 600" ] || fail "runtime-state.json: $(stat -c '%U %a' /var/lib/isoswitch/runtime-state.json)"
echo "ok: /var/lib/isoswitch 0700, the drain saved in runtime-state.json 0600"
systemctl reload isoswitch
for _ in $(seq 100); do
    journalctl --no-pager -u isoswitch -o cat | grep -q "SIGHUP: config reloaded" && break
    sleep 0.1
done
journalctl --no-pager -u isoswitch -o cat | grep -q "SIGHUP: config reloaded" || fail "no reload logged"
[ "$(admin_of_02)" = '"admin":"drain"' ] || fail "after reload 02 is $(admin_of_02)"
echo "ok: systemctl reload keeps the drain"
systemctl restart isoswitch
up
[ "$(admin_of_02)" = '"admin":"drain"' ] || fail "after restart 02 is $(admin_of_02)"
echo "ok: systemctl restart keeps the drain"
systemctl stop isoswitch
echo PASS
PROBE
    chmod 0755 "$root/usr/local/bin/isoswitch-probe"
    cat >"$root/etc/systemd/system/isoswitch-probe.service" <<'UNIT'
[Unit]
Description=probe isoswitch.service
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
ExecStart=/usr/local/bin/isoswitch-probe
StandardOutput=append:/isoswitch-probe.log
StandardError=append:/isoswitch-probe.log
UNIT
    local rc=0
    timeout 180 systemd-nspawn -D "$root" --boot --register=no --keep-unit --private-network \
        --console=read-only --machine=isoswitch-check \
        systemd.unit=isoswitch-probe.service >"$work/boot.log" 2>&1 || rc=$?
    cat "$root/isoswitch-probe.log" 2>/dev/null || true
    if ! grep -qx PASS "$root/isoswitch-probe.log" 2>/dev/null; then
        echo "--- container console (last lines), systemd-nspawn exit status $rc:"
        sed 's/\x1b\[[0-9;]*m//g' "$work/boot.log" | tail -25
        return 1
    fi
}

if [ "${1:-}" = --in-namespace ]; then
    boot_and_probe "$2" "$3"
    exit
fi

for tool in systemd-analyze systemd-nspawn systemd-id128 unshare useradd curl; do
    command -v "$tool" >/dev/null \
        || fail "$tool is missing (apt-get install systemd systemd-container curl passwd; listed in scripts/deps/systemd.apt)"
done
[ "$(id -u)" -eq 0 ] || fail "needs root: it mounts in a private namespace and boots a container"

cargo build --locked --quiet
bin=$(realpath "${CARGO_TARGET_DIR:-target}/debug/isoswitch")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

verify=$(unshare -m --propagation private sh -c \
    'mount -t tmpfs tmpfs "$3" && mkdir "$3/bin" "$3/work" && cp "$1" "$3/bin/isoswitch" &&
     mount -t overlay overlay -o "lowerdir=/usr/bin,upperdir=$3/bin,workdir=$3/work" /usr/bin &&
     systemd-analyze verify --man=no "$2" 2>&1' \
    sh "$bin" "$UNIT" "$work") || fail "systemd-analyze verify $UNIT: ${verify:-cannot run (no mount namespace: run as root on a host that allows unshare -m)}"
[ -z "$verify" ] || fail "systemd-analyze verify $UNIT warns: $verify"
echo "ok systemd.sh: systemd-analyze verify $UNIT"

unshare -m --propagation private "$0" --in-namespace "$work" "$bin" \
    || fail "$UNIT under a real systemd (systemd-nspawn): see above"
echo "ok systemd.sh: $UNIT starts under systemd as user isoswitch, reads its token credential, keeps a drain through reload and restart"
