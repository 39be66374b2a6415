#!/bin/sh
# Two versions of the kernels timed in one process, in alternating trials (tools/kernel_ab.c):
#   tools/kernel_ab.sh A B SET TYPE MODE [N] [TRIALS]
# A and B: a git revision (HEAD, a commit, a branch) or a directory holding pensieve.c and
# tests/bench_simd.c ("." : the working tree). SET: a kernel set (avx512, avxvnni, avx2, amx,
# neon, dotprod, i8mm, ref), TYPE: Q4_0, Q4_K, ...; MODE: hot, g1hot, gemv1 (a 128 MiB matrix,
# from memory, in 2 MiB pages; AB_SMALL_PAGES=1: 4 KiB), gemmR, pp128; N: the row length (default
# 4096); TRIALS: default 200. CC (default cc) and CFLAGS (default -O2) build both.
# Revisions from before tools/kernel_ab.c's (their bench_simd.c has no bs_setup_gemm) do not build.
# Prints whether both compute the same outputs, then each one's minimum, 10th percentile and
# median ns a value and the ratios B / A. Exits 3 if the outputs differ. AB_OUT=DIR keeps the
# builds there (DIR/kernel_ab DIR/a.so DIR/b.so SET TYPE MODE ... then measures more without
# building again; each build of pensieve.c takes about a minute).
set -e
[ $# -ge 5 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
A=$1 B=$2
shift 2
CC=${CC:-cc}
CFLAGS=${CFLAGS:--O2}
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${AB_OUT:-}" ]; then
    mkdir -p "$AB_OUT"
    out=$(cd "$AB_OUT" && pwd)
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
# The directory with a version's pensieve.c and tests/bench_simd.c: $1 itself, or its files at
# that revision.
src() {
    if [ -d "$1" ]; then (cd "$1" && pwd); return; fi
    mkdir -p "$out/$2/tests"
    git -C "$repo" show "$1:pensieve.c" > "$out/$2/pensieve.c"
    git -C "$repo" show "$1:pensieve.h" > "$out/$2/pensieve.h"
    git -C "$repo" show "$1:tests/bench_simd.c" > "$out/$2/tests/bench_simd.c"
    echo "$out/$2"
}
da=$(src "$A" a)
db=$(src "$B" b)
lib() { # version directory, output
    $CC $CFLAGS -std=c11 -fPIC -shared -fvisibility=hidden -Werror=implicit-function-declaration -DAB_LIB \
        -Dmain=ab_bench_main -I"$1/tests" -I"$1" "$repo/tools/kernel_ab.c" -o "$2" -lpthread
}
lib "$da" "$out/a.so" & pa=$!
if [ "$da" = "$db" ]; then wait $pa || exit 1; cp "$out/a.so" "$out/b.so"; else lib "$db" "$out/b.so" || exit 1; wait $pa || exit 1; fi
$CC -O2 -std=c11 "$repo/tools/kernel_ab.c" -o "$out/kernel_ab" -ldl
echo "A: $A  B: $B"
"$out/kernel_ab" "$out/a.so" "$out/b.so" "$@"
