#!/usr/bin/env bash
# The container image, deploy/Containerfile, checked without a container
# engine (this machine has the docker client and no daemon):
#
# 1. scripts/checks/lib/image_rootfs.py lays out the Containerfile's runtime
#    stage as a directory: the release binary built here where the COPY puts
#    it, the config, the data volume with its owner and mode, and in place of
#    distroless/cc-debian12 its users (nonroot = 65532) and the shared
#    libraries the binary needs (it fails on one distroless/cc lacks). It
#    reads ENV, USER, VOLUME, HEALTHCHECK, ENTRYPOINT and CMD from the file.
# 2. In fresh network, PID and mount namespaces, as the image's USER, chrooted
#    into that directory with the image's environment and nothing else:
#    - `isoswitch check` on the image's config (CMD's --config) passes, and
#      the image's ENV moves the admin API to 0.0.0.0:9090;
#    - ENTRYPOINT + CMD start the switch (two sim nodes at the config's
#      addresses stand for channel nodes), running as that user;
#    - the HEALTHCHECK command passes; /healthz answers from outside the
#      image; `ctl health --ready` passes once the nodes are up;
#    - the token from the secret /run/secrets/admin-token (the credential
#      directory the image's ENV names) opens the API; a drain is saved in
#      the data volume, owned by the user, mode 0600;
#    - the log on stderr is JSON lines; SIGTERM (docker stop) exits 0.
#
# Not checked here: that the image builds (the rust build stage, BuildKit's
# COPY --chown/--chmod), the real distroless/cc-debian12 contents, Docker's
# own HEALTHCHECK scheduling, volume mounts and port publishing.
#
# Needs root (namespaces, chroot) and scripts/deps/package.apt. Fails, never
# skips, saying what is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL image.sh: $*"
    exit 1
}

# Inside the namespaces: run the image. $1 = scratch directory (holding
# rootfs/ and image.env), $2 = an isoswitch built with the tools, for the
# sim nodes (the image's own has none).
inside() {
    local work=$1 bin=$2 root=$1/rootfs
    # shellcheck disable=SC1091
    source "$work/image.env"
    local chroot_bin
    chroot_bin=$(command -v chroot)
    # What docker gives every container, then the image's own ENV. (An array,
    # not a function: `"${in_image[@]}" CMD &` is the switch's own PID.)
    local in_image=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        HOME=/home/nonroot HOSTNAME=isoswitch "${ENV_ARGS[@]}"
        "$chroot_bin" --userspec="$RUN_UID:$RUN_GID" "$root")
    ip link set lo up

    local config="" i
    for ((i = 0; i < ${#CMD[@]}; i++)); do
        [ "${CMD[$i]}" = --config ] && config=${CMD[$((i + 1))]}
    done
    [ -n "$config" ] || fail "CMD names no --config"
    local checked
    checked=$("${in_image[@]}" "${ENTRYPOINT[@]}" check --config "$config" 2>&1) \
        || fail "isoswitch check --config $config in the image: $checked"
    grep -q '^listen = "0.0.0.0:9090"' <<<"$checked" \
        || fail "the image's ENV does not put the admin API on 0.0.0.0:9090: $checked"
    echo "ok image.sh: isoswitch check passes on the image's $config as uid $RUN_UID (admin API on 0.0.0.0:9090)"

    "$bin" sim node --listen 127.0.0.1:7001 --spec cup-pos --id 01 >/dev/null 2>&1 &
    "$bin" sim node --listen 127.0.0.1:7002 --spec cup-pos --id 02 >/dev/null 2>&1 &
    "${in_image[@]}" "${ENTRYPOINT[@]}" "${CMD[@]}" 2>"$work/switch.log" &
    local pid=$!
    local healthy=""
    for _ in $(seq 100); do
        if "${in_image[@]}" "${HEALTHCHECK[@]}" >/dev/null 2>&1; then
            healthy=yes
            break
        fi
        sleep 0.1
    done
    [ -n "$healthy" ] || { cat "$work/switch.log"; fail "HEALTHCHECK (${HEALTHCHECK[*]}) never passed"; }
    [ "$(curl -sf http://127.0.0.1:9090/healthz)" = ok ] || fail "/healthz from outside the image"
    [ "$(stat -c %u "/proc/$pid")" = "$RUN_UID" ] || fail "the switch runs as uid $(stat -c %u "/proc/$pid")"
    echo "ok image.sh: ENTRYPOINT + CMD run as uid $RUN_UID; the HEALTHCHECK passes; /healthz answers"
    local ready=""
    for _ in $(seq 100); do
        if "${in_image[@]}" "${HEALTHCHECK[@]}" --ready >/dev/null 2>&1; then
            ready=yes
            break
        fi
        sleep 0.1
    done
    [ -n "$ready" ] || fail "not ready with both nodes up: $("${in_image[@]}" "${HEALTHCHECK[@]}" --ready 2>&1)"

    local token api
    token=$(cat "$root/run/secrets/admin-token")
    api() { curl -sf -H "Authorization: Bearer $token" "$@"; }
    api http://127.0.0.1:9090/api/v1/status >/dev/null || fail "the secret's token is refused"
    api -X POST -H "Content-Type: application/json" \
        http://127.0.0.1:9090/api/v1/services/pos/nodes/02/drain >/dev/null || fail "drain refused"
    local state=$root/var/lib/isoswitch/runtime-state.json
    [ "$(stat -c '%u %a' "$state" 2>/dev/null)" = "$RUN_UID 600" ] \
        || fail "runtime-state.json in the data volume: $(stat -c '%u %a' "$state" 2>&1)"
    echo "ok image.sh: ready with both nodes; the token comes from /run/secrets/admin-token; a drain is saved in the data volume (uid $RUN_UID, 0600)"

    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 0 ] || { tail -5 "$work/switch.log"; fail "SIGTERM: exit status $rc"; }
    python3 -c '
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert lines, "no log lines"
for l in lines:
    json.loads(l)
' "$work/switch.log" || fail "the log on stderr is not JSON lines: $(head -3 "$work/switch.log")"
    echo "ok image.sh: JSON log lines; SIGTERM stops it with exit status 0"
}

if [ "${1:-}" = --inside ]; then
    inside "$2" "$3"
    exit
fi

for tool in unshare chroot ip curl python3 ldd; do
    command -v "$tool" >/dev/null \
        || fail "$tool is missing (apt-get install util-linux coreutils iproute2 curl python3 libc-bin; listed in scripts/deps/package.apt)"
done
[ "$(id -u)" -eq 0 ] || fail "needs root: it makes namespaces and chroots as another user"

target=${CARGO_TARGET_DIR:-target}
# The image's binary as deploy/Containerfile builds it: without the `tools`
# feature. The sim nodes come from the default (debug) build, which has them.
# In package.sh's target dir (target/package): built once for both checks.
CARGO_TARGET_DIR="$target/package" cargo build --profile production --locked --no-default-features --bin isoswitch --quiet
cargo build --locked --bin isoswitch --quiet
sims=$(realpath "$target/debug/isoswitch")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rootfs"
python3 scripts/checks/lib/image_rootfs.py deploy/Containerfile . "$target/package" "$work/rootfs" >"$work/image.env" \
    || fail "cannot lay out the runtime stage of deploy/Containerfile"
# A compose/swarm secret, readable by the image's user only.
# shellcheck disable=SC1091
source "$work/image.env"
mkdir -p "$work/rootfs/run/secrets"
od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$work/rootfs/run/secrets/admin-token"
chown "$RUN_UID:$RUN_GID" "$work/rootfs/run/secrets/admin-token"
chmod 0400 "$work/rootfs/run/secrets/admin-token"
echo "ok image.sh: the runtime stage laid out: $(find "$work/rootfs" -type f | wc -l) files, $(du -sh "$work/rootfs" | cut -f1)"

unshare --net --pid --fork --mount-proc --mount --propagation private \
    "$0" --inside "$work" "$sims" || fail "the image's runtime stage: see above"
