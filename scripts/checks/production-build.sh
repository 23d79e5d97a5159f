#!/usr/bin/env bash
# The production build carries no tools. `scripts/package.sh` builds the
# switch with `--no-default-features`: without the `tools` feature, so
# without the simulators (src/sim), `load`, `bench` and `demo`. Checked on a
# debug build of the same features (a second release build would cost CI
# minutes; the features, not the profile, decide what is linked):
#
# 1. it builds without a warning (no dead code left behind the cfg);
# 2. `isoswitch --help` lists none of sim, load, bench, demo, and each of
#    them fails saying the binary was built without tools;
# 3. the binary has no `isoswitch::sim::` symbol (while it has the switch's
#    `isoswitch::link::` ones, so the search is not vacuous), and the default
#    build, rebuilt after, has them (the control);
# 4. `cargo tree` of the production features has no indicatif;
# 5. captures in clear are refused: `check` of a config with
#    `capture.clear = true` fails naming the key, `run --capture-clear` too.
#
# The default build is restored at the end (target/debug/isoswitch is what
# the tests and the other checks run). Needs nm (scripts/deps/build.apt).
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
    echo "FAIL production-build.sh: $*"
    exit 1
}
command -v nm >/dev/null || fail "nm is missing (apt-get install binutils; listed in scripts/deps/build.apt)"

target=${CARGO_TARGET_DIR:-target}
bin=$target/debug/isoswitch
trap 'cargo build --locked --quiet --bin isoswitch' EXIT
log=$(mktemp)
cargo build --locked --no-default-features --bin isoswitch 2>"$log" \
    || { cat "$log"; fail "cargo build --no-default-features --bin isoswitch"; }
if grep -q '^warning' "$log"; then
    cat "$log"
    fail "cargo build --no-default-features warns (code left unused behind cfg(feature = \"tools\")?)"
fi
rm -f "$log"
echo "ok production-build.sh: cargo build --no-default-features --bin isoswitch, no warning"

help=$("$bin" --help)
for cmd in sim load bench demo; do
    if grep -qE "^  $cmd( |$)" <<<"$help"; then
        fail "isoswitch --help lists \`$cmd\` in the production build"
    fi
    if out=$("$bin" "$cmd" 2>&1); then
        fail "isoswitch $cmd succeeded in the production build"
    fi
    grep -q "built without tools" <<<"$out" || fail "isoswitch $cmd does not say the binary was built without tools: $out"
done
echo "ok production-build.sh: --help lists no sim, load, bench, demo; each says the binary was built without tools"

work=$(mktemp -d)
cp deploy/isoswitch.toml "$work/clear.toml"
printf '\n[service.capture]\ndirectory = "%s"\nclear = true\n' "$work/captures" >>"$work/clear.toml"
if out=$("$bin" check --config "$work/clear.toml" 2>&1); then
    fail "isoswitch check accepts capture.clear = true in the production build"
fi
grep -q 'service\[0\]\.capture\.clear' <<<"$out" || fail "isoswitch check refuses capture.clear without naming the key: $out"
if out=$(timeout 20 "$bin" run --capture "$work/captures" --capture-clear 2>&1); then
    fail "isoswitch run --capture-clear ran in the production build"
fi
grep -q 'capture-clear (capture.clear)' <<<"$out" || fail "isoswitch run --capture-clear refused without naming it: $out"
rm -rf "$work"
echo "ok production-build.sh: capture.clear and --capture-clear are refused, naming the key"

symbols=$(mktemp)
nm -C "$bin" >"$symbols"
switch=$(grep -c 'isoswitch::link::' "$symbols" || true)
sim=$(grep -c 'isoswitch::sim::' "$symbols" || true)
rm -f "$symbols"
[ "$switch" -gt 0 ] || fail "no isoswitch::link:: symbol in $bin: the symbol search would prove nothing"
[ "$sim" -eq 0 ] || fail "$sim isoswitch::sim:: symbols in the production binary"
echo "ok production-build.sh: no isoswitch::sim:: symbol in the production binary ($switch isoswitch::link:: ones)"

if cargo tree --locked -e normal --no-default-features -p isoswitch --prefix none | grep -q '^indicatif '; then
    fail "indicatif is a dependency of the production build"
fi
echo "ok production-build.sh: cargo tree --no-default-features has no indicatif"

trap - EXIT
cargo build --locked --quiet --bin isoswitch
control=$(nm -C "$bin" | grep -c 'isoswitch::sim::' || true)
[ "$control" -gt 0 ] || fail "the default build has no isoswitch::sim:: symbol either: the check cannot tell the builds apart"
"$bin" sim --help >/dev/null || fail "the default build has no \`isoswitch sim\`"
echo "ok production-build.sh: the default build (restored) has the simulators ($control isoswitch::sim:: symbols)"
