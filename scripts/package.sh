#!/usr/bin/env bash
# Builds the Debian package: target/debian/isoswitch_VERSION-1_ARCH.deb, and
# its debug symbols as isoswitch-dbgsym_VERSION-1_ARCH.ddeb. Prints the
# .deb's path as its last line.
#
#   scripts/package.sh            # then: dpkg -i target/debian/isoswitch_*.deb
#   scripts/package.sh --fast     # lighter compression (40 s less, 25 % larger):
#                                 # for checks, not for shipping
#
# 1. cargo-deb (the version below) from crates.io, if that one is missing;
# 2. the binary, once, with the `production` profile (fat LTO, one codegen
#    unit) and without the `tools` feature (--no-default-features): the
#    switch ships without the simulators, `load`, `bench` and `demo`
#    (scripts/checks/production-build.sh). It builds in a target directory
#    of its own (target/package), so packaging never replaces the tools
#    build that `target/release/isoswitch sim ...` and the tests use;
# 3. the man pages and shell completions from the command line's own
#    definitions, built with the same features so they list the same
#    subcommands (examples/package_docs.rs, a debug build of an example);
# 4. `cargo deb --no-build`: what goes where is [package.metadata.deb] in
#    Cargo.toml; the unit and the maintainer scripts are in deploy/.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
fast=()
case "${1:-}" in
    --fast) fast=(--fast) ;;
    "") ;;
    *) echo "usage: scripts/package.sh [--fast]" >&2; exit 2 ;;
esac

if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
    echo "package.sh: cargo install cargo-deb $CARGO_DEB_VERSION (crates.io)" >&2
    cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION" --quiet
fi
command -v objcopy >/dev/null \
    || { echo "package.sh: objcopy is missing (apt-get install binutils; listed in scripts/deps/package.apt)" >&2; exit 1; }

target=${CARGO_TARGET_DIR:-target}
# The production features: everything but `tools` (Cargo.toml [features]).
features=(--no-default-features)
export CARGO_TARGET_DIR="$target/package"
cargo build --profile production --locked "${features[@]}" --bin isoswitch --quiet
# The man pages and completions: a debug example, in the main target dir
# (where Cargo.toml's assets name them).
rm -rf "$target/package-docs"
CARGO_TARGET_DIR="$target" cargo run --locked --quiet "${features[@]}" --example package_docs -- "$target/package-docs"
cargo deb --no-build --profile production --locked --quiet "${fast[@]}" >&2
ls -t "$CARGO_TARGET_DIR"/debian/isoswitch_*.deb | head -1
