#!/bin/sh
# tests/cli_buildflags.sh — the numbers pensieve computes must not depend on how pensieve.c is
# compiled. Compilers fuse a * b + c into one FMA unless told not to (GCC in its default GNU mode
# at -O2, clang within expressions), which changes last bits, and the reference models turn last
# bits into visible logit changes. Builds pensieve.c with gcc and clang at -O2 in their default
# (GNU) language mode, and with gcc without flags, and checks that `pensieve logits` prints exactly
# what $PSV_BIN prints, for the first case of every reference model, and so does a build with
# -DPSV_NO_SIMD_KERNELS (the reference kernels only) what $PSV_BIN prints with them; that builds
# without flags say whether they are optimised (`info --cpu`) and warn of nothing at -Wall
# -Wextra (nor link other libraries: threads without -lpthread), also with musl (musl-gcc); and
# that the file is strict ISO C11.
# Needs $PSV_BIN and ../shared ($PSV_SHARED).
# Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }

if [ -z "$PSV_BIN" ] || [ ! -x "$PSV_BIN" ]; then
    bad "PSV_BIN is not set to an executable (got '$PSV_BIN')"; finish
fi
src=$(cd "$(dirname "$0")/.." && pwd)/pensieve.c
ref=${PSV_SHARED:-../shared}/reference
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psv_cli_buildflags.XXXXXX") || { bad "mktemp -d failed"; finish; }
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP

# Built with no flags, gcc optimises the file itself (a pragma: -O0 is its default), so that
# `cc pensieve.c -o pensieve` is fast; clang cannot be told to, and such a build says so. These
# builds also have -Wall -Wextra -Werror (which change no code): the house rule is no warnings.
# The builds (these two, the -O2 ones and the one without SIMD kernels, all checked below) run side
# by side: they are most of this test's time.
# build OUT COMPILER ARGS...: $tmp/OUT, the compiler's messages in $tmp/OUT.err, its status in
# $tmp/OUT.rc.
# The builds without flags are the README's `cc pensieve.c -o pensieve`, so without -lpthread
# (glibc before 2.34 keeps threads in libpthread: pensieve.c loads it itself there).
build() {
    out=$1; shift
    lib=-lpthread; case $out in flagless-*) lib= ;; esac
    "$@" -o "$tmp/$out" $lib >"$tmp/$out.err" 2>&1; echo $? >"$tmp/$out.rc"
}
built() { [ "$(cat "$tmp/$1.rc" 2>/dev/null)" = 0 ]; }
for cc in gcc clang; do
    command -v $cc >/dev/null 2>&1 || continue
    build flagless-$cc $cc -Wall -Wextra -Werror "$src" &
    [ -d "$ref/expected" ] && build pensieve-$cc $cc -O2 "$src" &
done
# PSV_NO_SIMD_KERNELS (the downloader's, the fuzz program's and the ASan library object's): the
# reference kernels only.
command -v gcc >/dev/null 2>&1 && build pensieve-nosimd gcc -O2 -DPSV_NO_SIMD_KERNELS -Wall -Wextra -Werror "$src" &
# musl's C library (Alpine's; Debian's musl-tools give musl-gcc, which links statically): built
# without flags, it must compute what the test build computes, with two threads (musl's threads
# start with 128 KiB stacks).
command -v musl-gcc >/dev/null 2>&1 && build flagless-musl musl-gcc -Wall -Wextra -Werror "$src" &
wait
for cc in gcc clang; do
    if ! command -v $cc >/dev/null 2>&1; then
        skip=$((skip + 1)); echo "skipped: $cc is not installed"; continue
    fi
    if ! built flagless-$cc; then
        bad "$cc -Wall -Wextra -Werror pensieve.c (no other flags) failed"; cat "$tmp/flagless-$cc.err"; continue
    fi
    "$tmp/flagless-$cc" info --cpu >"$tmp/cpu.out" 2>"$tmp/cpu.err"
    want="build: optimised"; [ $cc = clang ] && want="build: not optimised"
    if grep -qx "$want" "$tmp/cpu.out"; then ok; else bad "$cc without flags: info --cpu does not say '$want'"; cat "$tmp/cpu.out"; fi
    if [ $cc = clang ]; then
        if grep -q "rebuild with: cc -O2" "$tmp/cpu.err"; then ok; else bad "clang without flags: no warning to rebuild with -O2"; fi
    elif [ -s "$tmp/cpu.err" ]; then bad "gcc without flags: info --cpu warns: $(cat "$tmp/cpu.err")"
    else ok
    fi
done
if built pensieve-nosimd; then
    "$tmp/pensieve-nosimd" info --cpu >"$tmp/cpu.out" 2>&1
    if grep -qx "kernel sets supported: ref" "$tmp/cpu.out" && grep -qx "kernel set: ref" "$tmp/cpu.out"; then ok
    else bad "-DPSV_NO_SIMD_KERNELS: info --cpu does not say the reference kernels are the only set"; cat "$tmp/cpu.out"
    fi
fi
# Strict ISO C11 (-pedantic, warnings as errors): what a compiler that accepts nothing beyond the
# standard would refuse (e.g. a string literal past the 4095 characters C11 requires); and so
# without the SIMD kernels (helpers only they call must not warn as unused).
for cc in gcc clang; do
    command -v $cc >/dev/null 2>&1 || { skip=$((skip + 2)); echo "skipped: $cc is not installed"; continue; }
    for def in "" -DPSV_NO_SIMD_KERNELS; do
        if $cc -std=c11 -pedantic -Wall -Wextra -Werror $def -fsyntax-only "$src" 2>"$tmp/cc.err"; then ok
        else bad "$cc -std=c11 -pedantic -Werror $def: $(head -n 3 "$tmp/cc.err")"
        fi
    done
done
if [ ! -d "$ref/expected" ]; then
    skip=$((skip + 1)); echo "skipped: $ref/expected is absent: no reference models to compute"
    finish
fi
# The -O2 builds, the optimised gcc build without flags and the build without SIMD code compute
# what the test build computes (the last with its reference kernels, PSV_KERNELS=ref).
builds=
for b in gcc clang nosimd; do
    cc=$b; [ $b = nosimd ] && cc=gcc
    if ! command -v $cc >/dev/null 2>&1; then skip=$((skip + 1)); echo "skipped: $cc is not installed"
    elif built pensieve-$b; then builds="$builds $b"
    else bad "$cc -O2 pensieve.c ($b) failed"; cat "$tmp/pensieve-$b.err"
    fi
done
built flagless-gcc && cp "$tmp/flagless-gcc" "$tmp/pensieve-flagless-gcc" && builds="$builds flagless-gcc"
if ! command -v musl-gcc >/dev/null 2>&1; then skip=$((skip + 1)); echo "skipped: musl-gcc is not installed (Debian: musl-tools)"
elif built flagless-musl; then cp "$tmp/flagless-musl" "$tmp/pensieve-flagless-musl"; builds="$builds flagless-musl"
else bad "musl-gcc -Wall -Wextra -Werror pensieve.c failed"; cat "$tmp/flagless-musl.err"
fi

# logits BIN [OPTION...]: the top logits BIN computes for model $name's ids $ids
logits() { bin=$1; shift; "$bin" logits -m "$ref/models/$name.gguf" --ids "$ids" --ctx 512 --kv-type f32 --top 16 "$@" 2>&1; }
for exp in "$ref"/expected/*.json; do
    name=$(basename "$exp" .json)
    # the first case's prompt and generated ids, with the contract's context and KV type
    ids=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["cases"][0]; print(",".join(map(str, c["prompt_ids"] + c["gen_ids"])))' "$exp") ||
        { bad "$name: cannot read $exp"; continue; }
    logits "$PSV_BIN" >"$tmp/want.out"
    PSV_KERNELS=ref logits "$PSV_BIN" >"$tmp/want-nosimd.out"
    for b in $builds; do
        want=$tmp/want.out than=$PSV_BIN
        [ $b = nosimd ] && want=$tmp/want-nosimd.out than="$PSV_BIN with PSV_KERNELS=ref"
        # (two threads for the builds without flags: their pools' threads are made as above)
        t=; case $b in flagless-*) t="--threads 2" ;; esac
        logits "$tmp/pensieve-$b" $t >"$tmp/got.out"
        if cmp -s "$want" "$tmp/got.out"; then ok
        else bad "$name: the '$b' build computes other logits than $than"; diff "$want" "$tmp/got.out" | head -n 4
        fi
    done
done
finish
