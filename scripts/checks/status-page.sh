#!/usr/bin/env bash
# The status page in a real browser: headless Chromium (Debian's chromium)
# renders the live GET / of a switch carrying NAC traffic after node 02 was drained
# through the API; the rendered DOM must show node 02 as draining and the
# others up, and a screenshot is taken (kept in target/status-page.png).
set -euo pipefail
cd "$(dirname "$0")/../.."
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
    echo "FAIL status-page.sh: chromium is missing (apt-get install chromium; listed in scripts/deps/ops.apt)"
    exit 1
fi
source scripts/checks/lib/switch.sh
start_switch
nac_load 1s
AUTH="Authorization: Bearer $ISOSWITCH_ADMIN_TOKEN"
curl -sf -X POST -H "$AUTH" -H "Content-Type: application/json" "http://$ADMIN/api/v1/services/pos/nodes/02/drain" >/dev/null
browse() {
    timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run \
        --user-data-dir="$WORK/profile-$1" "${@:2}" 2>>"$WORK/chromium.log"
}
browse dom --dump-dom "http://$ADMIN/" > "$WORK/dom.html"
browse shot --screenshot="$WORK/status.png" --window-size=1200,800 "http://$ADMIN/" >/dev/null
mkdir -p target && cp "$WORK/status.png" target/status-page.png
row() { grep -o "<tr class=\"[a-z]*\" data-node=\"$1\">" "$WORK/dom.html" | head -1; }
[ "$(row 02)" = '<tr class="draining" data-node="02">' ] \
    || { echo "FAIL status-page.sh: node 02 does not show as draining: $(row 02)"; exit 1; }
[ "$(row 01)" = '<tr class="up" data-node="01">' ] \
    || { echo "FAIL status-page.sh: node 01 does not show as up: $(row 01)"; exit 1; }
[ -s target/status-page.png ] || { echo "FAIL status-page.sh: no screenshot"; exit 1; }
echo "ok status-page.sh: Chromium shows node 02 draining (screenshot: target/status-page.png)"
