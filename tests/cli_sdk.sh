#!/bin/sh
# tests/cli_sdk.sh — the official Anthropic (@anthropic-ai/sdk) and OpenAI (openai) SDKs from npm
# against the real server on loopback, with an API key. Installs the pinned packages into
# build/sdk-node (not committed). Skips, saying why, without node/npm or the reference model.
BIN=${PSV_BIN:-./pensieve}
SHARED=${PSV_SHARED:-../shared}
MODEL="$SHARED/reference/models/phi3-q5km.gguf"
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "skipped: SDK tests: $*" >&2; echo "0 passed, 0 failed, 1 skipped"; exit 0; }
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || skip "node and npm are needed"
[ -f "$MODEL" ] || skip "$MODEL is absent"
dir="$here/../build/sdk-node"
mkdir -p "$dir"
cp "$here/sdk/package.json" "$here/sdk/sdk_test.mjs" "$dir/"
if [ ! -d "$dir/node_modules/@anthropic-ai/sdk" ] || [ ! -d "$dir/node_modules/openai" ]; then
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null 2>&1) || {
        echo "FAIL: npm install of the SDKs failed" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 18777)
log=$(mktemp)
"$BIN" serve -m "$MODEL" --port "$port" --ctx 1024 --parallel 2 --api-key sdk-test-key >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 100); do grep -q "serving" "$log" && break; sleep 0.1; done
grep -q "serving" "$log" || { cat "$log" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
node "$dir/sdk_test.mjs" "http://127.0.0.1:$port" sdk-test-key
