#!/bin/sh
# tests/cli_server.sh — the HTTP server against a reference model, driven by
# tests/server_test.py over loopback (127.0.0.1, an ephemeral port).
BIN=${PSV_BIN:-./pensieve}
SHARED=${PSV_SHARED:-../shared}
MODEL="$SHARED/reference/models/phi3-q5km.gguf"
if ! command -v python3 >/dev/null 2>&1; then
    echo "skipped: server tests need python3" >&2
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if [ ! -f "$MODEL" ]; then
    echo "skipped: server tests need $MODEL" >&2
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
exec python3 "$(dirname "$0")/server_test.py" "$BIN" "$MODEL"
