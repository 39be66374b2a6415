#!/bin/sh
# tests/cli_pull.sh — tools/pensieve-pull against a local misbehaving HTTP server
# (tests/http_fixture.py on 127.0.0.1, ephemeral port; nothing else is contacted), then
# `pensieve list/verify/rm/pull` on what it downloaded.
#   $PSV_PULL  the pensieve-pull binary (default: tools/pensieve-pull, then build/pensieve-pull)
#   $PSV_BIN   the pensieve binary (its list/verify/rm/pull checks are skipped when it has no
#              `list` command yet)
# Skips cleanly without python3 or pensieve-pull. Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; [ -f err ] && sed -n '1,12p' err | sed 's/^/    | /'; }
skipped() { skip=$((skip + 1)); echo "skipped: $*"; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
if ! command -v python3 >/dev/null 2>&1; then
    skipped "python3 is not installed: the test HTTP server needs it"; finish
fi
PULL=${PSV_PULL:-}
if [ -z "$PULL" ]; then
    for c in "$root/tools/pensieve-pull" "$root/build/pensieve-pull"; do
        if [ -x "$c" ]; then PULL=$c; break; fi
    done
fi
if [ -z "$PULL" ] || [ ! -x "$PULL" ]; then
    skipped "pensieve-pull is not built (it needs libcurl's development files: apt-get install libcurl4-openssl-dev, then make)"
    finish
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/psv_cli_pull.XXXXXX") || { bad "mktemp -d failed"; finish; }
fpid=
trap 'if [ -n "$fpid" ]; then kill "$fpid" 2>/dev/null; wait "$fpid" 2>/dev/null; fi; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP
cd "$tmp" || { bad "cd $tmp"; finish; }
mkdir srv cache

# Files the server serves: one random 3,000,000-byte pool under many names (each test its own
# name, so their partial files never meet), two different versions for the If-Range cases, and a
# small one for the slow drip.
head -c 3000000 /dev/urandom >pool
head -c 3000000 /dev/urandom >pool2
head -c 600000 /dev/urandom >small
for n in model resume auto norange badrange f416 big416 r3 r10 r11 xh same bad corrupt shabad cc full \
         noetag stall s404 viapsv plain; do
    cp pool "srv/$n.gguf"
done
cp pool srv/w.gguf.v1; cp pool2 srv/w.gguf.v2
cp pool srv/mix.gguf.v1; cp pool2 srv/mix.gguf.v2
cp small srv/drip.gguf
cp pool srv/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf
sha() { sha256sum "$1" | cut -d' ' -f1; }
SHA=$(sha pool) SHA2=$(sha pool2)

python3 "$here/http_fixture.py" --root "$tmp/srv" --port-file "$tmp/port" --log "$tmp/log" 2>fixture.err &
fpid=$!
i=0
while [ ! -s port ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -s port ]; then bad "the test HTTP server did not start: $(cat fixture.err)"; finish; fi
PORT=$(cat port)
B="http://127.0.0.1:$PORT"
: >log

# pull ARGS... — pensieve-pull with the cache in $tmp/cache; stdout to out, stderr to err, status in rc.
pull() { env PENSIEVE_HOME="$tmp/cache" "$PULL" "$@" >out 2>err; rc=$?; }
mark() { mark_at=$(wc -l <log); }
# logq EXPR — evaluates a Python expression over R, the requests that started since the last
# mark (each its start and done entries merged), once all of them are done (at most 10 s).
logq() {
    python3 - "$mark_at" "$1" <<'PY'
import json, sys, time
since, expr = int(sys.argv[1]), sys.argv[2]
for _ in range(200):
    lines = [json.loads(l) for l in open("log") if l.strip()]
    R = [dict(e) for e in lines[since:] if e["event"] == "start"]
    done = {e["id"]: e for e in lines if e["event"] == "done"}
    if all(r["id"] in done for r in R):
        break
    time.sleep(0.05)
for r in R:
    r.update(done.get(r["id"], {"status": None, "sent": None}))
print(eval(expr))
PY
}
same_file() { cmp -s "$1" "$2"; }
no_leftovers() { # NAME: no partial, meta, lock or temporary files left in the cache
    for s in .partial .partial.meta .lock .sha256.tmp; do [ -e "cache/$1$s" ] && return 1; done
    return 0
}

# --- the registry ------------------------------------------------------------------------------
pull --list
if [ $rc -eq 0 ] && grep -q '^phi-4-mini\*' out && grep -q '^qwen3-1.7b ' out && grep -q '^llama-3.2-1b ' out; then ok
else bad "--list should print the registry with phi-4-mini as the default (rc $rc)"; fi
pull --help
if [ $rc -eq 0 ] && grep -q 'usage: pensieve-pull' out; then ok; else bad "--help (rc $rc)"; fi
pull nonesuch-model
if [ $rc -eq 2 ] && grep -q "not a known model" err; then ok; else bad "unknown name should be a usage error (rc $rc)"; fi
pull "$B/model.gguf" --sha256 1234
if [ $rc -eq 2 ]; then ok; else bad "--sha256 with a bad digest should be a usage error (rc $rc)"; fi

# --- a plain download, then the same again ------------------------------------------------------
mark; pull "$B/model.gguf"
if [ $rc -eq 0 ] && same_file cache/model.gguf pool && [ "$(cat out)" = "$tmp/cache/model.gguf" ]; then ok
else bad "plain download (rc $rc)"; fi
if [ "$(cat cache/model.gguf.sha256)" = "$SHA  model.gguf" ]; then ok; else bad "sidecar: '$(cat cache/model.gguf.sha256)'"; fi
if no_leftovers model.gguf; then ok; else bad "leftover files after a download: $(ls cache)"; fi
if grep -q "verified against the server (ETag)" err; then ok; else bad "the server's 64-hex ETag should be the expected digest"; fi
mark; pull "$B/model.gguf"
if [ $rc -eq 0 ] && grep -q "already downloaded and verified" err && [ "$(logq 'len(R)')" = 0 ]; then ok
else bad "a second pull should find the file done without a request (rc $rc)"; fi

# --- interrupted at 30 %, then resumed: only the rest is transferred -----------------------------
mark; pull "$B/cut=900000/resume.gguf" --retries 0
if [ $rc -eq 1 ] && [ "$(wc -c <cache/resume.gguf.partial)" -eq 900000 ] && [ ! -e cache/resume.gguf ] &&
   grep -q "run the same command again to resume" err; then ok
else bad "a cut at 30% should fail and keep 900000 bytes in the partial file (rc $rc)"; fi
mark; pull "$B/resume.gguf"
if [ $rc -eq 0 ] && same_file cache/resume.gguf pool && no_leftovers resume.gguf; then ok; else bad "resume (rc $rc)"; fi
if [ "$(logq 'R[0]["range"]')" = "bytes=900000-" ] && [ "$(logq 'sum(r["sent"] for r in R)')" = 2100000 ] &&
   [ "$(logq 'R[0]["status"]')" = 206 ] && [ "$(logq 'R[0]["if_range"]')" = "\"$SHA\"" ]; then ok
else bad "the resume should ask for bytes=900000- with If-Range and get only 2100000 bytes: $(tail -n 1 log)"; fi

# --- a dropped connection is resumed automatically ----------------------------------------------
mark; pull "$B/cut=1000000/auto.gguf"
if [ $rc -eq 0 ] && same_file cache/auto.gguf pool && [ "$(logq 'len(R)')" = 3 ] &&
   [ "$(logq 'sum(r["sent"] for r in R)')" = 3000000 ] && grep -q "retrying" err; then ok
else bad "cuts every 1000000 bytes should be resumed within one run, 3 requests (rc $rc)"; fi

# --- a server that ignores Range: 200 instead of 206 restarts from zero ---------------------------
pull "$B/cut=700000/norange.gguf" --retries 0
mark; pull "$B/norange/norange.gguf"
if [ $rc -eq 0 ] && same_file cache/norange.gguf pool && grep -q "starting over" err &&
   [ "$(logq 'R[0]["status"]')" = 200 ]; then ok
else bad "200 to a range request should restart from zero (rc $rc)"; fi

# --- a 206 with the wrong Content-Range fails and keeps the partial -------------------------------
pull "$B/cut=800000/badrange.gguf" --retries 0
pull "$B/badrange/badrange.gguf"
if [ $rc -eq 1 ] && grep -q "Content-Range" err && [ "$(wc -c <cache/badrange.gguf.partial)" -eq 800000 ]; then ok
else bad "a wrong Content-Range should fail and leave the partial as it was (rc $rc)"; fi
pull "$B/badrange.gguf"
if [ $rc -eq 0 ] && same_file cache/badrange.gguf pool; then ok; else bad "resume after a wrong Content-Range (rc $rc)"; fi

# --- 416 for a complete partial goes on to verification; for an oversized one, starts over ---------
cp pool cache/f416.gguf.partial
mark; pull "$B/f416.gguf"
if [ $rc -eq 0 ] && same_file cache/f416.gguf pool && [ "$(logq 'R[0]["status"]')" = 416 ] && no_leftovers f416.gguf; then ok
else bad "416 on a complete partial should verify and finish (rc $rc)"; fi
cat pool small >cache/big416.gguf.partial
pull "$B/big416.gguf"
if [ $rc -eq 0 ] && same_file cache/big416.gguf pool; then ok; else bad "416 on an oversized partial should start over (rc $rc)"; fi

# --- the file changed on the server: If-Range mismatch restarts --------------------------------------
pull "$B/ver=v1/cut=900000/w.gguf" --retries 0
mark; pull "$B/ver=v2/w.gguf"
if [ $rc -eq 0 ] && same_file cache/w.gguf pool2 && [ "$(logq 'R[0]["status"]')" = 200 ] &&
   logq 'R[0]["if_range"]' | grep -q '"v1-'; then ok
else bad "a changed file (If-Range mismatch) should be downloaded anew (rc $rc)"; fi
# A server that ignores If-Range mixes two versions: the digest catches it.
pull "$B/ver=v1/cut=900000/mix.gguf" --retries 0
pull "$B/ver=v2/noifrange/mix.gguf" --sha256 "$SHA2"
if [ $rc -eq 1 ] && grep -q "mismatch" err && grep -q "$SHA2" err && [ ! -e cache/mix.gguf ] &&
   [ ! -e cache/mix.gguf.partial ]; then ok
else bad "mixed versions should fail the digest and delete the partial (rc $rc)"; fi

# --- redirects: 3 and 10 are followed, 11 is too many ----------------------------------------------
pull "$B/redirect=3/r3.gguf"
if [ $rc -eq 0 ] && same_file cache/r3.gguf pool; then ok; else bad "3 redirects (rc $rc)"; fi
pull "$B/redirect=10/r10.gguf"
if [ $rc -eq 0 ] && same_file cache/r10.gguf pool; then ok; else bad "10 redirects (rc $rc)"; fi
pull "$B/redirect=11/r11.gguf"
if [ $rc -eq 1 ] && grep -q "too many redirects" err && [ ! -e cache/r11.gguf ] && [ ! -e cache/r11.gguf.partial ]; then ok
else bad "11 redirects should fail (rc $rc)"; fi

# --- credentials: kept on the same host, dropped when a redirect changes host ----------------------
mark; HF_TOKEN=sekrit pull "$B/redirect=1/same.gguf"
if [ $rc -eq 0 ] && [ "$(logq '[r["auth"] for r in R]')" = "[True, True]" ]; then ok
else bad "a same-host redirect should keep the token: $(logq '[r["auth"] for r in R]')"; fi
mark; HF_TOKEN=sekrit pull "$B/xhost=other.test/xh.gguf" --resolve "other.test:$PORT:127.0.0.1"
if [ $rc -eq 0 ] && same_file cache/xh.gguf pool &&
   [ "$(logq '[(r["host"].split(":")[0], r["auth"]) for r in R]')" = "[('127.0.0.1', True), ('other.test', False)]" ]; then ok
else bad "a cross-host redirect must drop the token: $(logq '[(r["host"], r["auth"]) for r in R]')"; fi
if grep -q "X-Linked-Etag" err; then ok; else bad "the digest should come from the redirect's X-Linked-Etag"; fi

# --- digests: wrong server digest, corrupted byte, wrong --sha256, none at all ----------------------
pull "$B/baddigest/bad.gguf"
if [ $rc -eq 1 ] && grep -q "$SHA" err && grep -q "expected" err && [ ! -e cache/bad.gguf ] &&
   [ ! -e cache/bad.gguf.partial ] && no_leftovers bad.gguf; then ok
else bad "a wrong server digest should fail with both digests and leave nothing (rc $rc)"; fi
pull "$B/corrupt=1234567/corrupt.gguf"
if [ $rc -eq 1 ] && grep -q "expected $SHA" err && grep -q "received " err && [ ! -e cache/corrupt.gguf ] &&
   [ ! -e cache/corrupt.gguf.partial ]; then ok
else bad "a corrupted byte should fail with both digests and leave nothing (rc $rc)"; fi
pull "$B/shabad.gguf" --sha256 0000000000000000000000000000000000000000000000000000000000000000
if [ $rc -eq 1 ] && grep -q "expected 0000000000000000000000000000000000000000000000000000000000000000" err &&
   grep -q "received $SHA" err; then ok
else bad "--sha256 mismatch should print both digests (rc $rc)"; fi
pull "$B/plainetag/noetag.gguf"
if [ $rc -eq 0 ] && same_file cache/noetag.gguf pool && grep -q "recorded as received" err &&
   [ "$(cat cache/noetag.gguf.sha256)" = "$SHA  noetag.gguf" ]; then ok
else bad "without any digest the file is kept and its digest recorded (rc $rc)"; fi
pull "$B/xlinked/plain.gguf"
if [ $rc -eq 0 ] && grep -q "X-Linked-Etag" err; then ok; else bad "X-Linked-Etag on the response itself (rc $rc)"; fi

# --- errors: 404, stall, offline ---------------------------------------------------------------------
pull "$B/status=404/s404.gguf"
if [ $rc -eq 1 ] && grep -q "404" err && [ ! -e cache/s404.gguf.partial ]; then ok; else bad "404 (rc $rc)"; fi
t0=$(date +%s)
pull "$B/stall=100000/stall.gguf" --stall-timeout 2 --retries 0
t1=$(date +%s)
if [ $rc -eq 1 ] && grep -q "stalled" err && [ "$(wc -c <cache/stall.gguf.partial)" -eq 100000 ] && [ $((t1 - t0)) -lt 20 ]; then ok
else bad "a stalled transfer should time out and keep the partial (rc $rc, $((t1 - t0)) s)"; fi
t0=$(date +%s)
pull "http://127.0.0.1:1/offline.gguf" --dir "$tmp/off"
t1=$(date +%s)
if [ $rc -eq 1 ] && grep -q "cannot reach 127.0.0.1" err && [ $((t1 - t0)) -lt 15 ] && [ ! -e off/offline.gguf.partial ]; then ok
else bad "an unreachable server should fail at once with one clear message (rc $rc, $((t1 - t0)) s)"; fi
PENSIEVE_MIRROR=http://127.0.0.1:1 pull qwen2.5-0.5b --dir "$tmp/off"
if [ $rc -eq 1 ] && grep -q "curl -fL" err && grep -q "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653" err &&
   grep -q "pensieve pull qwen2.5-0.5b" err; then ok
else bad "offline, a registry model should print the commands to fetch it later (rc $rc)"; fi

# --- slow drip: completes, with plain progress lines off a terminal -------------------------------------
pull "$B/drip=400000/drip.gguf"
if [ $rc -eq 0 ] && same_file cache/drip.gguf small && grep -q "%" err; then ok
else bad "a slow drip should complete with progress lines (rc $rc)"; fi

# --- registry models through a mirror -------------------------------------------------------------------
QP=/bartowski/Qwen2.5-0.5B-Instruct-GGUF/resolve/b26a58accf53b1a19fbc555d52fdb224bec473f5/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf
mark; pull qwen2.5-0.5b --mirror "$B/"
if [ $rc -eq 1 ] && grep -q "397808192" err && [ ! -e cache/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf ] &&
   [ ! -e cache/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf.partial ] && [ "$(logq 'R[0]["path"]')" = "$QP" ]; then ok
else bad "a registry model of the wrong size should be refused before downloading (rc $rc): $(logq 'R[0]["path"]')"; fi
pull qwen2.5-0.5b --mirror "$B/baddigest" --sha256 "$SHA"
if [ $rc -eq 1 ] && grep -q "not downloading" err; then ok
else bad "an X-Linked-Etag that contradicts the expected digest should stop the download early (rc $rc)"; fi
mark; PENSIEVE_MIRROR="$B" PENSIEVE_PULL_SHA256="$SHA" pull qwen2.5-0.5b
if [ $rc -eq 0 ] && same_file cache/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf pool && [ "$(logq 'R[0]["path"]')" = "$QP" ]; then ok
else bad "a registry model through PENSIEVE_MIRROR, digest from PENSIEVE_PULL_SHA256 (rc $rc)"; fi

# --- two pulls of one file at once: one waits, the file is right, downloaded once ------------------------
mark
env PENSIEVE_HOME="$tmp/cache" "$PULL" "$B/drip=1500000/cc.gguf" >out1 2>err1 &
p1=$!
env PENSIEVE_HOME="$tmp/cache" "$PULL" "$B/drip=1500000/cc.gguf" >out2 2>err2 &
p2=$!
wait $p1; rc1=$?
wait $p2; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && same_file cache/cc.gguf pool && cat err1 err2 | grep -q "waiting" &&
   [ "$(logq 'sum(r["sent"] for r in R)')" = 3000000 ] && no_leftovers cc.gguf; then ok
else bad "concurrent pulls (rc $rc1 $rc2): $(cat err1 err2 | head -n 6)"; fi

# --- disk full (here: the file-size limit) leaves the previous good file intact --------------------------
pull "$B/full.gguf"
( ulimit -f 1000 && exec env PENSIEVE_HOME="$tmp/cache" "$PULL" "$B/full.gguf" --force ) >out 2>err
rc=$?
if [ $rc -eq 1 ] && grep -q "no space" err && same_file cache/full.gguf pool &&
   [ "$(cat cache/full.gguf.sha256)" = "$SHA  full.gguf" ]; then ok
else bad "a full disk should fail clearly and leave the previous file and its sidecar (rc $rc)"; fi

# --- pensieve list / verify / rm / pull on the result -----------------------------------------------------
if [ -z "$PSV_BIN" ] || [ ! -x "$PSV_BIN" ] || ! "$PSV_BIN" list --help >/dev/null 2>&1; then
    skipped "pensieve list/verify/rm/pull: \$PSV_BIN ('$PSV_BIN') has no list command yet"
    finish
fi
psv() { env PENSIEVE_HOME="$tmp/cache" PENSIEVE_PULL="$PULL" "$PSV_BIN" "$@" >out 2>err; rc=$?; }
psv list
if [ $rc -eq 0 ] && grep -q '^-  *model.gguf  *3.0 MB  *verified' out && grep -q 'stall.gguf.partial.*partial' out &&
   grep -q '^qwen2.5-0.5b .*MISMATCH' out; then ok
else bad "pensieve list (rc $rc): $(cat out)"; fi
psv list --all
if [ $rc -eq 0 ] && grep -q '^phi-4-mini .*not downloaded' out; then ok; else bad "pensieve list --all (rc $rc)"; fi
psv verify model.gguf
if [ $rc -eq 0 ] && grep -q "OK (sha256 $SHA" out; then ok; else bad "pensieve verify NAME (rc $rc)"; fi
psv verify "$tmp/cache/resume.gguf"
if [ $rc -eq 0 ]; then ok; else bad "pensieve verify PATH (rc $rc)"; fi
python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[777]^=1; open(p,'wb').write(b)" cache/model.gguf
psv verify model.gguf
if [ $rc -eq 1 ] && grep -q "expected $SHA" err && grep -q "actual " err; then ok
else bad "pensieve verify of a changed file should fail with both digests (rc $rc)"; fi
cp pool loose.gguf
psv verify ./loose.gguf
if [ $rc -eq 1 ] && grep -q "nothing to compare" err; then ok; else bad "verify without any reference (rc $rc)"; fi
psv verify qwen2.5-0.5b
if [ $rc -eq 1 ] && grep -q "397808192" err; then ok; else bad "verify against the registry's size (rc $rc)"; fi
psv rm model.gguf
if [ $rc -eq 0 ] && [ ! -e cache/model.gguf ] && [ ! -e cache/model.gguf.sha256 ]; then ok; else bad "pensieve rm (rc $rc)"; fi
psv rm model.gguf
if [ $rc -eq 1 ]; then ok; else bad "pensieve rm of a missing model should fail (rc $rc)"; fi
psv rm ../etc
if [ $rc -eq 1 ]; then ok; else bad "pensieve rm must refuse paths (rc $rc)"; fi
psv rm stall.gguf
if [ $rc -eq 0 ] && [ ! -e cache/stall.gguf.partial ]; then ok; else bad "pensieve rm of a partial download (rc $rc)"; fi
psv pull "$B/viapsv.gguf"
if [ $rc -eq 0 ] && same_file cache/viapsv.gguf pool; then ok; else bad "pensieve pull runs pensieve-pull (rc $rc)"; fi
env PENSIEVE_HOME="$tmp/cache" PENSIEVE_PULL=/nonexistent/pensieve-pull PATH=/nonexistent "$PSV_BIN" pull qwen2.5-0.5b >out 2>err
rc=$?
if [ $rc -eq 1 ] && grep -q "libcurl4-openssl-dev" err && grep -q "curl -fL" err; then ok
else bad "pensieve pull without the tool should say how to get it (rc $rc)"; fi
finish
