#!/bin/sh
# tests/cli_zeroconf.sh — the zero-config first run: with an empty cache and PENSIEVE_MIRROR
# pointing at a local HTTP server (tests/http_fixture.py on 127.0.0.1) that serves a generated
# model under the default model's file name, bare `pensieve` downloads it with pensieve-pull,
# verifies it, and ends up serving. Also: the same start with --mirror, and offline failure.
BIN=${PSV_BIN:-./pensieve}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
PULL=${PSV_PULL:-}
[ -n "$PULL" ] || for c in "$root/tools/pensieve-pull" "$root/build/pensieve-pull"; do [ -x "$c" ] && PULL=$c && break; done
if ! command -v python3 >/dev/null 2>&1 || [ -z "$PULL" ]; then
    echo "skipped: zero-config start: needs python3 and pensieve-pull (libcurl)" >&2; skip=1; finish
fi
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psv_zeroconf.XXXXXX")
fpid= spid=
trap 'kill $fpid $spid 2>/dev/null; wait $fpid $spid 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/srv" "$tmp/home" "$tmp/home2"
file=microsoft_Phi-4-mini-instruct-Q4_K_M.gguf
"$BIN" mkmodel -q -o "$tmp/srv/$file" --arch phi3 --embd 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --seed 7 \
    >/dev/null 2>&1 || { bad "mkmodel failed"; finish; }
sha=$(sha256sum "$tmp/srv/$file" | cut -d' ' -f1)
python3 "$here/http_fixture.py" --root "$tmp/srv" --port-file "$tmp/fport" --log "$tmp/flog" 2>/dev/null &
fpid=$!
i=0; while [ ! -s "$tmp/fport" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$tmp/fport" ] || { bad "fixture server did not start"; finish; }
mirror="http://127.0.0.1:$(cat "$tmp/fport")"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# first run: downloads, verifies (PENSIEVE_PULL_SHA256 stands in for the registry digest, which a
# generated file cannot match), then serves
PENSIEVE_HOME="$tmp/home" PENSIEVE_MIRROR="$mirror" PENSIEVE_PULL_SHA256="$sha" PENSIEVE_PULL="$PULL" \
    "$BIN" --port "$port" >"$tmp/out" 2>"$tmp/err" &
spid=$!
i=0; while ! grep -q "serving" "$tmp/out" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "serving phi-4-mini" "$tmp/out" && ok || bad "no ready line: $(cat "$tmp/out" "$tmp/err" | tail -5)"
[ -f "$tmp/home/$file" ] && [ "$(sha256sum "$tmp/home/$file" | cut -d' ' -f1)" = "$sha" ] && ok || bad "model not in the cache"
[ -f "$tmp/home/$file.sha256" ] && ok || bad "no recorded digest"
code=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/health').status)" 2>/dev/null)
[ "$code" = 200 ] && ok || bad "health: $code"
ans=$(python3 - "$port" <<'PY'
import json, sys, urllib.request
r = urllib.request.Request('http://127.0.0.1:%s/v1/messages' % sys.argv[1], method='POST', headers={'content-type': 'application/json'},
    data=json.dumps({'model': 'x', 'max_tokens': 3, 'messages': [{'role': 'user', 'content': 'hi'}]}).encode())
print(json.loads(urllib.request.urlopen(r).read())['type'])
PY
)
[ "$ans" = message ] && ok || bad "messages on the downloaded model: $ans"
kill $spid; wait $spid 2>/dev/null; spid=

# second run: already cached, starts without downloading (the fixture sees no new request)
n_before=$(wc -l <"$tmp/flog")
PENSIEVE_HOME="$tmp/home" PENSIEVE_MIRROR="$mirror" PENSIEVE_PULL="$PULL" "$BIN" --port "$port" >"$tmp/out2" 2>&1 &
spid=$!
i=0; while ! grep -q "serving" "$tmp/out2" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "serving phi-4-mini" "$tmp/out2" && [ "$(wc -l <"$tmp/flog")" = "$n_before" ] && ok || bad "cached start: $(tail -3 "$tmp/out2")"
kill $spid; wait $spid 2>/dev/null; spid=

# --mirror on the command line works like PENSIEVE_MIRROR
PENSIEVE_HOME="$tmp/home2" PENSIEVE_PULL_SHA256="$sha" PENSIEVE_PULL="$PULL" "$BIN" --mirror "$mirror" --port "$port" >"$tmp/out3" 2>&1 &
spid=$!
i=0; while ! grep -q "serving" "$tmp/out3" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "serving phi-4-mini" "$tmp/out3" && ok || bad "--mirror start: $(tail -3 "$tmp/out3")"
kill $spid; wait $spid 2>/dev/null; spid=

# offline (nothing listens at the mirror): fails within seconds naming the commands to run later
start=$(date +%s)
PENSIEVE_HOME="$tmp/home3" PENSIEVE_MIRROR="http://127.0.0.1:9" PENSIEVE_PULL="$PULL" "$BIN" --port "$port" >"$tmp/out4" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $(( $(date +%s) - start )) -lt 15 ] && grep -q "pensieve pull phi-4-mini" "$tmp/out4" && grep -q "curl " "$tmp/out4" \
    && ok || bad "offline start: rc $rc: $(tail -4 "$tmp/out4")"
finish
