#!/bin/sh
# tests/cli_oldglibc.sh — `cc pensieve.c -o pensieve` on an older system than the one the suite
# runs on: Debian 11 (gcc 10.2, binutils 2.35.2, glibc 2.31, as on Ubuntu 20.04, RHEL 8 and
# Amazon Linux 2 by their glibc), in the root directory $PSV_OLD_ROOT names (.ci/run makes one
# with `debootstrap --variant=minbase --include=gcc,libc6-dev bullseye`). There the assembler
# does not know AVX-VNNI's instructions (pensieve.c writes them out as bytes) and threads live
# in libpthread, which a build without flags does not link (pensieve.c loads it itself). Checks,
# inside that root: the build without flags warns of nothing at -Wall -Wextra and links no
# libpthread; its `logits` with two threads prints what $PSV_BIN prints; its server answers two
# requests at once (a scheduler thread and a thread a connection).
# Needs root or unprivileged user namespaces (chroot), python3, $PSV_BIN and ../shared.
# Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
skipall() { skip=$((skip + 1)); echo "skipped: $*"; finish; }

root=$PSV_OLD_ROOT
model=${PSV_SHARED:-../shared}/reference/models/phi3-q5km.gguf
[ -n "$root" ] || skipall "older-system build: PSV_OLD_ROOT names no root (.ci/run makes one with debootstrap)"
[ -x "$root/usr/bin/gcc" ] || skipall "older-system build: $root/usr/bin/gcc is missing"
[ -n "$PSV_BIN" ] && [ -x "$PSV_BIN" ] || { bad "PSV_BIN is not set to an executable (got '$PSV_BIN')"; finish; }
[ -f "$model" ] || skipall "older-system build: needs $model"
command -v python3 >/dev/null 2>&1 || skipall "older-system build: needs python3"
# inroot CMD...: CMD run in the root (as root, or in a user namespace that maps us to root)
if [ "$(id -u)" = 0 ]; then inroot() { chroot "$root" "$@"; }
else inroot() { unshare -r chroot "$root" "$@"; }
fi
inroot /bin/true 2>/dev/null || skipall "older-system build: cannot chroot into $root (not root, no user namespaces)"
glibc=$(inroot ldd --version 2>&1 | head -n 1)
case "$glibc" in
*" 2."[0-2][0-9] | *" 2.3"[0-3]) ;;
*) skipall "older-system build: $root has no glibc before 2.34 ($glibc)" ;;
esac

src=$(cd "$(dirname "$0")/.." && pwd)
work=/tmp/psv_oldglibc.$$ # (the root's /tmp: writable without root)
mkdir "$root$work" || { bad "cannot make $root$work"; finish; }
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$root$work"' EXIT
trap 'exit 1' INT TERM HUP
cp "$src/pensieve.c" "$src/pensieve.h" "$root$work/" && cp "$model" "$root$work/model.gguf" ||
    { bad "cannot copy pensieve.c and the model into $root$work"; finish; }

echo "$glibc; $(inroot cc --version | head -n 1)"
if inroot sh -c "cd $work && cc -Wall -Wextra -Werror pensieve.c -o pensieve" >"$root$work/cc.err" 2>&1; then ok
else bad "cc -Wall -Wextra -Werror pensieve.c -o pensieve in $root:"; head -n 20 "$root$work/cc.err"; finish
fi
if inroot ldd "$work/pensieve" | grep -q libpthread; then bad "the build without flags links libpthread"; else ok; fi

ids=1,2,3,4,5,6,7,8
"$PSV_BIN" logits -m "$model" --ids $ids --top 8 --threads 2 >"$root$work/want.out" 2>&1
inroot "$work/pensieve" logits -m "$work/model.gguf" --ids $ids --top 8 --threads 2 >"$root$work/got.out" 2>&1
if [ -s "$root$work/want.out" ] && cmp -s "$root$work/want.out" "$root$work/got.out"; then ok
else bad "logits with two threads differ from \$PSV_BIN's:"; diff "$root$work/want.out" "$root$work/got.out" | head -n 6
fi

port=$(cd "$src/tests" && python3 -c 'from psvtest import free_port; print(free_port())')
inroot "$work/pensieve" serve -m "$work/model.gguf" --host 127.0.0.1 --port "$port" --threads 2 \
    >"$root$work/serve.out" 2>&1 &
pid=$!
# Two requests at once, after the server answers on its port (up to 30 s): both must be whole
# messages.
if python3 - "$port" <<'EOF'; then ok; else bad "the server did not answer two requests at once:"; head -n 5 "$root$work/serve.out"; fi
import http.client, json, sys, threading, time
port = int(sys.argv[1])
for _ in range(300):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", "/v1/models")
        c.getresponse().read()
        break
    except OSError:
        time.sleep(0.1)
results = []
def ask(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hello %d" % i}]}
    c.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    results.append((r.status, json.loads(r.read()).get("type")))
ts = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print("responses:", results)
sys.exit(0 if results == [(200, "message")] * 2 else 1)
EOF
kill $pid 2>/dev/null
wait $pid 2>/dev/null
pid=
finish
