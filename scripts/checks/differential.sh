#!/usr/bin/env bash
# Differential test of specs/ and the codec against an independent encoder
# (pyiso8583) and independent field tables (jPOS packagers): random messages
# per dialect must decode with isoswitch to exactly what was encoded.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v python3 >/dev/null; then
    echo "differential: python3 is missing" >&2
    exit 1
fi
if ! python3 -c "import iso8583" 2>/dev/null; then
    echo "differential: pyiso8583 is missing: python3 -m pip install pyiso8583 (scripts/deps/differential.pip)" >&2
    exit 1
fi
cargo build --locked --quiet --bin isoswitch
python3 scripts/differential.py --messages 500 --isoswitch "${CARGO_TARGET_DIR:-target}/debug/isoswitch"
