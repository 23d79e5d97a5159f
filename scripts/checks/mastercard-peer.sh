#!/usr/bin/env bash
# An independent Mastercard peer (pyiso8583 and the Mastercard table of
# scripts/differential.py, none of isoswitch's code) on a duplex link that a
# real switch dials: its sign-on, its echo answers and the nodes' answers to
# the peer's issuer requests must be what the peer itself encodes, byte for
# byte (scripts/mastercard_peer.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v python3 >/dev/null; then
    echo "mastercard-peer: python3 is missing" >&2
    exit 1
fi
if ! python3 -c "import iso8583" 2>/dev/null; then
    echo "mastercard-peer: pyiso8583 is missing: python3 -m pip install pyiso8583 (scripts/deps/differential.pip)" >&2
    exit 1
fi
cargo build --locked --quiet --bin isoswitch
python3 scripts/mastercard_peer.py --isoswitch "${CARGO_TARGET_DIR:-target}/debug/isoswitch"
