#!/usr/bin/env bash
# Installs what the tests need beyond Rust: Debian packages named in
# scripts/deps/*.apt, PyPI packages named in scripts/deps/*.pip (one name a
# line, '#' comments), and cargo-deny (.ci/run's supply-chain check, built
# from crates.io). Does nothing when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob

names() { grep -hv '^\s*\(#\|$\)' "$@" 2>/dev/null | awk '{print $1}' | sort -u; }

apt_files=(scripts/deps/*.apt)
if [ ${#apt_files[@]} -gt 0 ]; then
    missing=()
    for pkg in $(names "${apt_files[@]}"); do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        echo "install-test-deps: apt-get install ${missing[*]}" >&2
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

pip_files=(scripts/deps/*.pip)
if [ ${#pip_files[@]} -gt 0 ]; then
    want=$(names "${pip_files[@]}")
    if [ -n "$want" ]; then
        # shellcheck disable=SC2086
        python3 -m pip install --quiet --disable-pip-version-check $want
    fi
fi

# cargo-deny 0.20 (deny.toml is written for it): licences, bans and sources
# in .ci/run; `check advisories` on a build host that reaches RustSec.
if ! cargo deny --version 2>/dev/null | grep -q '^cargo-deny 0\.20\.'; then
    echo "install-test-deps: cargo install --locked cargo-deny@~0.20" >&2
    cargo install --locked --quiet cargo-deny --version '~0.20'
fi
