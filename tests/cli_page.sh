#!/bin/sh
# tests/cli_page.sh — the chat page (GET /) in headless Chromium against the real server.
# Uses Debian's chromium and playwright-core from npm (installed into build/sdk-node). Skips,
# saying why, without chromium, node/npm or the reference model.
BIN=${PSV_BIN:-./pensieve}
SHARED=${PSV_SHARED:-../shared}
MODEL="$SHARED/reference/models/phi3-q5km.gguf"
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "skipped: chat page test: $*" >&2; echo "0 passed, 0 failed, 1 skipped"; exit 0; }
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || skip "node and npm are needed"
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || skip "chromium is not installed (Debian package chromium)"
[ -f "$MODEL" ] || skip "$MODEL is absent"
dir="$here/../build/sdk-node"
mkdir -p "$dir"
cp "$here/sdk/package.json" "$here/sdk/page_test.mjs" "$dir/"
if [ ! -d "$dir/node_modules/playwright-core" ]; then
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1) || {
        echo "FAIL: npm install failed" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 18778)
log=$(mktemp)
"$BIN" serve -m "$MODEL" --port "$port" --ctx 2048 --parallel 2 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 100); do grep -q "serving" "$log" && break; sleep 0.1; done
grep -q "serving" "$log" || { cat "$log" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
node "$dir/page_test.mjs" "http://127.0.0.1:$port"
