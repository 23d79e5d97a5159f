#!/usr/bin/env bash
# The Debian package (scripts/package.sh), installed on this machine with
# dpkg and purged again, leaving it as it was:
#
# 1. Refuses to run where isoswitch (package, user, /etc/isoswitch,
#    /var/lib/isoswitch or any file the package holds) is already there: it
#    would replace it and then purge it.
# 2. `dpkg -i`: a system user isoswitch with no login; /var/lib/isoswitch
#    0700 isoswitch; /etc/isoswitch/isoswitch.toml a conffile, root:isoswitch
#    0640; a root-only admin token; the binary, man pages (gzipped, one per
#    subcommand), bash/zsh/fish completions (bash's loads); the unit
#    installed, not enabled. `isoswitch check` passes on the installed config
#    as the user isoswitch (what the unit's ExecStartPre runs). A second
#    `dpkg -i` changes nothing: same user, same token.
# 3. The installed unit under a real systemd: this machine's PID 1 is not
#    systemd (and where it is, its services are left alone), so a container
#    (systemd-nspawn) boots this root through a throwaway overlay, with the
#    package installed as above. Inside: two sim nodes at the example
#    config's addresses (from the default debug build: the package's binary
#    has no simulators, and step 2 checks it says so); `systemctl start
#    isoswitch` runs it as isoswitch, ready, the postinst's token opens the
#    API (LoadCredential=); then `dpkg -r` stops the running unit and
#    `dpkg --purge` removes the rest with systemd running.
# 4. On this machine: `dpkg -r` keeps config, token, data and user;
#    `dpkg --purge` removes every one, and every path the package held is
#    back as it was (a file under /etc, /usr, /var/lib named *isoswitch*
#    that was not there before fails the check). Left changed: dpkg's log
#    and the /etc/passwd- style backups adduser/deluser keep.
#
# Needs root and scripts/deps/package.apt (+ systemd.apt for the container).
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL package.sh: $*"
    exit 1
}

# Inside a private mount namespace: boot a container over an overlay of this
# root (with the package installed) and run the probe. $1 = scratch dir,
# $2 = a build with the tools (the package's binary has no simulators).
boot_and_probe() {
    local work=$1 tools=$2
    mount -t tmpfs tmpfs /run
    mkdir -p "$work/ns"
    mount -t tmpfs tmpfs "$work/ns"
    mkdir -p "$work/ns/upper" "$work/ns/work" "$work/ns/root"
    mount -t overlay overlay \
        -o "lowerdir=/,upperdir=$work/ns/upper,workdir=$work/ns/work" "$work/ns/root"
    local root=$work/ns/root
    systemd-id128 new >"$root/etc/machine-id"
    # This machine's image forbids maintainer scripts to start or stop
    # services (a Docker-style policy-rc.d that exits 101); a host does not.
    rm -f "$root/usr/sbin/policy-rc.d"
    # The channel nodes the example config points at come from the default
    # build (with the `tools` feature): the package ships the switch only.
    install -m 0755 "$tools" "$root/usr/local/bin/isoswitch-tools"
    cat >"$root/usr/local/sbin/isoswitch-package-probe" <<'PROBE'
#!/bin/sh
set -eu
fail() { echo "FAIL: $*"; systemctl status --no-pager isoswitch || true; journalctl --no-pager -u isoswitch | tail -20; exit 1; }
[ "$(systemctl is-enabled isoswitch 2>&1 || true)" = disabled ] || fail "the unit is $(systemctl is-enabled isoswitch 2>&1) after install, not disabled"
isoswitch-tools sim node --listen 127.0.0.1:7001 --spec cup-pos --id 01 >/dev/null 2>&1 &
isoswitch-tools sim node --listen 127.0.0.1:7002 --spec cup-pos --id 02 >/dev/null 2>&1 &
systemctl start isoswitch || fail "systemctl start isoswitch"
for _ in $(seq 100); do curl -sf http://127.0.0.1:9090/readyz >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf http://127.0.0.1:9090/readyz >/dev/null || fail "not ready: $(curl -s http://127.0.0.1:9090/readyz)"
user=$(ps -o user= -p "$(systemctl show -p MainPID --value isoswitch)")
[ "$user" = isoswitch ] || fail "runs as $user"
ISOSWITCH_ADMIN_TOKEN=$(cat /etc/isoswitch/admin-token) isoswitch ctl status | grep -q '^pos ' \
    || fail "the token the package made does not open the API"
echo "ok: the installed unit starts (its ExecStartPre check passes), runs as isoswitch, is ready with the example config's two nodes, takes the package's token"
dpkg -r isoswitch >/dev/null 2>&1 || fail "dpkg -r"
[ "$(systemctl is-active isoswitch 2>&1 || true)" != active ] || fail "dpkg -r left the unit running"
dpkg --purge isoswitch >/dev/null 2>&1 || fail "dpkg --purge"
! getent passwd isoswitch >/dev/null || fail "purge left the user"
[ ! -e /etc/isoswitch ] && [ ! -e /var/lib/isoswitch ] || fail "purge left /etc/isoswitch or /var/lib/isoswitch"
echo "ok: with systemd running, dpkg -r stops the unit and dpkg --purge removes the rest"
echo PASS
PROBE
    chmod 0755 "$root/usr/local/sbin/isoswitch-package-probe"
    cat >"$root/etc/systemd/system/isoswitch-package-probe.service" <<'UNIT'
[Unit]
Description=probe the installed isoswitch package
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/isoswitch-package-probe
StandardOutput=append:/isoswitch-package-probe.log
StandardError=append:/isoswitch-package-probe.log
UNIT
    local rc=0
    timeout 180 systemd-nspawn -D "$root" --boot --register=no --keep-unit --private-network \
        --console=read-only --machine=isoswitch-package \
        systemd.unit=isoswitch-package-probe.service >"$work/boot.log" 2>&1 || rc=$?
    sed 's/^/    /' "$root/isoswitch-package-probe.log" 2>/dev/null || true
    if ! grep -qx PASS "$root/isoswitch-package-probe.log" 2>/dev/null; then
        echo "--- container console (last lines), systemd-nspawn exit status $rc:"
        sed 's/\x1b\[[0-9;]*m//g' "$work/boot.log" | tail -25
        return 1
    fi
}

if [ "${1:-}" = --in-namespace ]; then
    boot_and_probe "$2" "$3"
    exit
fi

for tool in dpkg dpkg-deb dpkg-query dpkg-statoverride adduser deluser runuser curl man \
    unshare systemd-nspawn systemd-id128 systemctl systemd-analyze; do
    command -v "$tool" >/dev/null \
        || fail "$tool is missing (apt-get install the packages in scripts/deps/package.apt and systemd.apt)"
done
[ "$(id -u)" -eq 0 ] || fail "needs root: it installs and purges a package"

# 1. Nothing of ours may be here already.
if dpkg-query -W -f='${Status}' isoswitch 2>/dev/null | grep -qv 'not-installed'; then
    fail "a package isoswitch is on this machine ($(dpkg-query -W -f='${Status}' isoswitch)): this check would replace and purge it"
fi
for what in passwd group; do
    ! getent "$what" isoswitch >/dev/null || fail "this machine has a $what entry isoswitch: this check would delete it"
done
for p in /etc/isoswitch /var/lib/isoswitch; do
    [ ! -e "$p" ] || fail "$p exists: this check would delete it"
done

started=$SECONDS
deb=$(scripts/package.sh --fast | tail -1)
[ -f "$deb" ] || fail "scripts/package.sh made no .deb"
echo "ok package.sh: built $deb in $((SECONDS - started)) s"

work=$(mktemp -d)
trap 'dpkg --purge isoswitch >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\.||; s|/$||' | grep . >"$work/paths"
while read -r p; do
    if [ -e "$p" ] && [ ! -d "$p" ]; then
        fail "$p exists: the package would overwrite it"
    fi
    if [ -e "$p" ]; then echo "$p"; fi
done <"$work/paths" >"$work/before"
named() { find /etc /usr /var/lib -xdev -name '*isoswitch*' -not -path '/var/lib/dpkg/*' 2>/dev/null | sort; }
named >"$work/named.before"

# 2. Install.
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i $deb"; }
[ "$(dpkg-query -W -f='${Status}' isoswitch)" = "install ok installed" ] || fail "not installed after dpkg -i"
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd isoswitch) || fail "no user isoswitch"
[ "$uid" -lt 1000 ] && [ "$home" = /var/lib/isoswitch ] && [ "$shell" = /usr/sbin/nologin ] \
    || fail "user isoswitch: uid $uid, home $home, shell $shell (want a system user, no login)"
[ "$(stat -c '%U %G %a' /var/lib/isoswitch)" = "isoswitch isoswitch 700" ] \
    || fail "/var/lib/isoswitch: $(stat -c '%U %G %a' /var/lib/isoswitch)"
[ "$(stat -c '%U %G %a' /etc/isoswitch/isoswitch.toml)" = "root isoswitch 640" ] \
    || fail "/etc/isoswitch/isoswitch.toml: $(stat -c '%U %G %a' /etc/isoswitch/isoswitch.toml)"
dpkg-query -W -f='${Conffiles}' isoswitch | grep -q '^ /etc/isoswitch/isoswitch.toml ' \
    || fail "/etc/isoswitch/isoswitch.toml is not a conffile"
[ "$(stat -c '%U %G %a' /etc/isoswitch/admin-token)" = "root root 600" ] \
    || fail "/etc/isoswitch/admin-token: $(stat -c '%U %G %a' /etc/isoswitch/admin-token)"
[ "$(head -1 /etc/isoswitch/admin-token | wc -c)" -gt 16 ] || fail "the admin token is too short"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
[ "$(/usr/bin/isoswitch --version)" = "isoswitch $version" ] || fail "isoswitch --version: $(/usr/bin/isoswitch --version)"
zcat /usr/share/man/man1/isoswitch.1.gz | grep -q '^\.TH isoswitch 1' || fail "no man page isoswitch(1)"
zcat /usr/share/man/man1/isoswitch-run.1.gz | grep -q '^\.TH isoswitch-run 1' || fail "no man page isoswitch-run(1)"
zcat /usr/share/man/man1/isoswitch.1.gz | grep -q '^\.SH FILES' || fail "isoswitch(1) has no FILES section"
bash -c 'source /usr/share/bash-completion/completions/isoswitch && complete -p isoswitch' >/dev/null \
    || fail "the bash completion does not load"
[ -s /usr/share/zsh/vendor-completions/_isoswitch ] && [ -s /usr/share/fish/vendor_completions.d/isoswitch.fish ] \
    || fail "no zsh or fish completion"
[ "$(systemctl is-enabled isoswitch 2>&1 || true)" = disabled ] \
    || fail "the unit is $(systemctl is-enabled isoswitch 2>&1) after install (want: installed, not enabled)"
verify=$(systemd-analyze verify /usr/lib/systemd/system/isoswitch.service 2>&1) \
    || fail "systemd-analyze verify on the installed unit: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify on the installed unit warns: $verify"
echo "ok package.sh: dpkg -i: system user isoswitch (uid $uid, nologin), /var/lib/isoswitch 0700, conffile /etc/isoswitch/isoswitch.toml root:isoswitch 0640, root-only token, man pages, completions, unit installed and not enabled (systemd-analyze verify finds its binary and man page)"
checked=$(runuser -u isoswitch -- /usr/bin/isoswitch check --config /etc/isoswitch/isoswitch.toml 2>&1) \
    || fail "isoswitch check on the installed config, as isoswitch: $checked"
echo "ok package.sh: isoswitch check --config /etc/isoswitch/isoswitch.toml passes as the user isoswitch"
out=$(/usr/bin/isoswitch sim node 2>&1) && fail "the packaged isoswitch runs \`sim node\`: it must be built without tools"
grep -q "built without tools" <<<"$out" || fail "the packaged isoswitch sim: $out"
/usr/bin/isoswitch --help | grep -qE '^  (sim|load|bench|demo) ' && fail "the packaged isoswitch --help lists a tool"
echo "ok package.sh: the packaged binary is built without tools (no sim, load, bench, demo)"
token_sum=$(sha256sum </etc/isoswitch/admin-token)
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i again"; }
[ "$(id -u isoswitch)" = "$uid" ] || fail "a reinstall changed the user's uid"
[ "$(sha256sum </etc/isoswitch/admin-token)" = "$token_sum" ] || fail "a reinstall replaced the admin token"
[ "$(dpkg-statoverride --list /etc/isoswitch/isoswitch.toml)" = "root isoswitch 640 /etc/isoswitch/isoswitch.toml" ] \
    || fail "stat override after a reinstall: $(dpkg-statoverride --list /etc/isoswitch/isoswitch.toml)"
echo "ok package.sh: a second dpkg -i keeps the user, the token and the config's mode"

# 3. The unit under systemd.
pid1=$(ps -p 1 -o comm=)
if [ -d /run/systemd/system ]; then
    echo "ok package.sh: systemd is PID 1 here; the unit is started in a container all the same, to leave this machine's services alone"
else
    echo "ok package.sh: PID 1 here is $pid1, not systemd: systemctl cannot start units on this machine, so the installed unit is started in a systemd-nspawn container booted from this root through a throwaway overlay"
fi
cargo build --locked --quiet --bin isoswitch
tools=$(realpath "${CARGO_TARGET_DIR:-target}/debug/isoswitch")
unshare -m --propagation private "$0" --in-namespace "$work" "$tools" \
    || fail "the installed unit under systemd (systemd-nspawn): see above"
echo "ok package.sh: under systemd the installed unit starts as isoswitch with the package's token; dpkg -r stops it, dpkg --purge cleans up"

# 4. Remove, then purge, on this machine.
dpkg -r isoswitch >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -r"; }
[ ! -e /usr/bin/isoswitch ] || fail "dpkg -r left /usr/bin/isoswitch"
for p in /etc/isoswitch/isoswitch.toml /etc/isoswitch/admin-token /var/lib/isoswitch; do
    [ -e "$p" ] || fail "dpkg -r removed $p (only a purge may)"
done
getent passwd isoswitch >/dev/null || fail "dpkg -r removed the user (only a purge may)"
dpkg --purge isoswitch >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --purge"; }
if dpkg-query -W -f='${Status}' isoswitch 2>/dev/null | grep -qv 'not-installed'; then
    fail "dpkg still knows isoswitch: $(dpkg-query -W -f='${Status}' isoswitch)"
fi
for what in passwd group shadow gshadow; do
    ! getent "$what" isoswitch >/dev/null || fail "purge left a $what entry"
done
! grep -q isoswitch /var/lib/dpkg/statoverride || fail "purge left a stat override"
ls /var/lib/dpkg/info/isoswitch.* >/dev/null 2>&1 && fail "purge left /var/lib/dpkg/info/isoswitch.*"
while read -r p; do if [ -e "$p" ]; then echo "$p"; fi; done <"$work/paths" >"$work/after"
diff -u "$work/before" "$work/after" >"$work/paths.diff" || fail "paths of the package not as before: $(cat "$work/paths.diff")"
named | diff -u "$work/named.before" - >"$work/named.diff" || fail "files named *isoswitch* not as before: $(cat "$work/named.diff")"
echo "ok package.sh: dpkg -r keeps config, token, data and user; dpkg --purge leaves no file, user, group or stat override behind ($(wc -l <"$work/paths") package paths checked) in $((SECONDS - started)) s"
