#!/usr/bin/env bash
# The README's test command, and what .ci/run calls.
#
# 1. Installs the outside tools the tests drive (Debian packages listed in
#    scripts/deps/*.apt, PyPI packages in scripts/deps/*.pip), as root with
#    apt-get / pip. Each area of the project owns its own list file.
# 2. Runs the Rust test suite (`cargo test --locked`, any extra arguments
#    passed through).
# 3. Runs every check script in scripts/checks/ (tools such as tshark or
#    promtool against what the switch writes). A check whose tool is missing
#    fails with a message that says so: nothing passes by skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo test --locked "$@"

shopt -s nullglob
for check in scripts/checks/*.sh; do
    echo "== $check"
    bash "$check"
done
