#!/bin/sh
# tests/cli_kernelab.sh — tools/kernel_ab.sh and tools/kernel_ab.c, the in-process A/B timing of
# two versions of the kernels. First the driver alone, against small stand-in libraries built
# here (no pensieve.c: each is a few lines): two that agree must give a table and exit 0; one
# whose outputs' digest differs must say DIFFER and exit 3; one that measures a different amount
# of work, one whose setup fails and a library without the four functions must each stop it with
# a message and exit 1; no arguments, the usage and exit 2. Then the whole tool on the working
# tree against itself (one build of pensieve.c, the `ref` set's Q4_0 dot product, which every CPU
# has): the same outputs, and a time for each; and with its builds, kept, a row length the type's
# blocks do not divide, an unknown set, type and mode and a GEMM or gemv1 kernel the set lacks,
# each refused with a message (exit 1), and the gemv1 mode (a 128 MiB matrix, from memory) with
# the first set the CPU has that has a gemv1 kernel (skipped, and said so, where none does).
# Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
cc=${CC:-cc}
if ! command -v "${cc%% *}" >/dev/null 2>&1; then skip=1; echo "skipped: $cc is not installed"; finish; fi
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! $cc -O2 -std=c11 "$root/tools/kernel_ab.c" -o "$tmp/kernel_ab" -ldl 2>"$tmp/err"; then
    cat "$tmp/err"; bad "the driver does not build"; finish
fi
cat > "$tmp/fake.c" <<'EOF'
#include <string.h>
static volatile unsigned long long sink;
int ab_setup(const char *set, const char *type, const char *mode, long long n) {
    (void)set, (void)type, (void)n;
    return strcmp(mode, "bad") == 0;
}
void ab_run(long long reps) {
    for (long long i = 0; i < reps * 2000; i++) sink += (unsigned long long)i;
}
double ab_units(void) { return UNITS; }
unsigned long long ab_digest(void) { return DIGEST; }
EOF
for v in "f1 1024 7" "f2 1024 7" "f3 1024 8" "f4 2048 7"; do
    set -- $v
    $cc -O1 -fPIC -shared -DUNITS=$2 -DDIGEST=$3 "$tmp/fake.c" -o "$tmp/$1.so" || { bad "fake library $1 does not build"; finish; }
done
echo 'int ab_setup(void) { return 0; }' > "$tmp/none.c"
$cc -fPIC -shared "$tmp/none.c" -o "$tmp/none.so" || { bad "the library without the functions does not build"; finish; }

# run NAME WANT_STATUS ARGS...: the driver's output in $tmp/NAME.out
run() {
    name=$1 want=$2
    shift 2
    "$tmp/kernel_ab" "$@" > "$tmp/$name.out" 2>&1
    rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, expected $want"; cat "$tmp/$name.out"; fi
}
# has NAME PATTERN: the output has a line matching the extended regex
has() {
    if grep -Eq "$2" "$tmp/$1.out"; then ok; else bad "$1: no line matching '$2'"; cat "$tmp/$1.out"; fi
}
num='[0-9]+\.[0-9]+'
run same 0 "$tmp/f1.so" "$tmp/f2.so" avx2 Q4_0 hot 256 5
has same '^outputs: identical \(0+7, 0+7\)$'
has same '^avx2 Q4_0 hot n=256: 5 trials of [0-9]+ calls each, ns a value$'
has same "^A +$num +$num +$num\$"
has same "^B +$num +$num +$num\$"
has same "^B / A +$num +$num +$num\$"
run differ 3 "$tmp/f1.so" "$tmp/f3.so" avx2 Q4_0 gemmR 256 3
has differ '^outputs: DIFFER \(0+7, 0+8\)$'
has differ ' ns a value and row$'
run units 1 "$tmp/f1.so" "$tmp/f4.so" avx2 Q4_0 hot
has units 'measure different amounts of work'
run setup 1 "$tmp/f1.so" "$tmp/f2.so" avx2 Q4_0 bad
run nolib 1 "$tmp/f1.so" "$tmp/none.so" avx2 Q4_0 hot
has nolib 'not built from tools/kernel_ab.c'
run missing 1 "$tmp/f1.so" "$tmp/nowhere.so" avx2 Q4_0 hot
run usage 2
has usage '^usage: kernel_ab A.so B.so SET TYPE MODE'
run trials 2 "$tmp/f1.so" "$tmp/f2.so" avx2 Q4_0 hot 256 0

# The real thing: the working tree against itself.
AB_OUT="$tmp/ab" CC="$cc" sh "$root/tools/kernel_ab.sh" "$root" "$root" ref Q4_0 hot 256 3 > "$tmp/tool.out" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then ok; else bad "tools/kernel_ab.sh exited $rc"; cat "$tmp/tool.out"; fi
has tool '^outputs: identical \([0-9a-f]{16}, [0-9a-f]{16}\)$'
has tool "^A +$num +$num +$num\$"
has tool "^B / A +$num +$num +$num\$"
# its builds kept (AB_OUT): the libraries' own checks
for v in "badn|ref Q4_K hot 100|N=100: Q4_K needs a multiple of 256" "badset|nosuchset Q4_0 hot|no kernel set 'nosuchset'" \
         "badtype|ref Q9_9 hot|no weight type 'Q9_9'" "badmode|ref Q4_0 fast|unknown mode 'fast'" \
         "nogemm|ref Q4_0 gemmR|set ref has no GEMM kernel for Q4_0" "nogemv1|ref Q4_0 gemv1|set ref has no gemv1 kernel for Q4_0"; do
    name=${v%%|*} rest=${v#*|}
    run "$name" 1 "$tmp/ab/a.so" "$tmp/ab/b.so" ${rest%%|*}
    has "$name" "${rest#*|}"
done
# gemv1: the one-row kernel on a 128 MiB matrix (from memory), where the CPU has a set with one
gset=
for s in avx512 avx2 dotprod neon; do
    if "$tmp/ab/kernel_ab" "$tmp/ab/a.so" "$tmp/ab/b.so" $s Q4_0 gemv1 256 1 > "$tmp/probe.out" 2>&1; then gset=$s; break; fi
done
if [ -n "$gset" ]; then
    run gemv1 0 "$tmp/ab/a.so" "$tmp/ab/b.so" $gset Q4_0 gemv1 256 2
    has gemv1 '^outputs: identical \([0-9a-f]{16}, [0-9a-f]{16}\)$'
    has gemv1 "^$gset Q4_0 gemv1 n=256: 2 trials of [0-9]+ calls each, ns a value\$"
    has gemv1 "^B / A +$num +$num +$num\$"
else
    skip=$((skip + 1)); echo "skipped: no kernel set with a gemv1 kernel here (gemv1 mode)"; cat "$tmp/probe.out"
fi
cat "$tmp/tool.out"
finish
