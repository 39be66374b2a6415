#!/bin/sh
# tests/cli_armicount.sh — tools/arm_icount.sh, which counts the ARM sets' F16 and BF16 kernels'
# instructions under qemu (PERFORMANCE.md, twenty-seventh session), and their quantized kernels since the
# twenty-ninth, builds and runs: it reports a count for every kernel and type (the tool itself
# checks each result against the reference), for the neon set (Q4_K: all but rows), with $ARM_CC
# and $QEMU (make test-arm64 passes them). Skipped where either is missing. Then
# tools/qemu_icount.c, the qemu plugin tools/llama_compare.py's `arm` counts instructions with
# (built with the host's cc): a loop of three instructions run 1000, 2000 and 5000 times must
# count exactly 3000 and 12000 more (skipped where qemu takes no plugins); with prof=FILE its
# blocks' counts must add up to the total and one block (the loop's) must hold 3 * 5000 of them
# (3 * 4999 where qemu's block before the loop takes its first pass).
# Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
cc=${ARM_CC:-aarch64-linux-gnu-gcc}
qemu=${QEMU:-qemu-aarch64}
for tool in "${cc%% *}" "${qemu%% *}"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        skip=1; echo "skipped: $tool is not installed"; finish
    fi
done
out=$(ARM_CC="$cc" QEMU="$qemu" sh "$(dirname "$0")/../tools/arm_icount.sh" neon f16 bf16 q4_k 2>&1); rc=$?
echo "$out"
if [ "$rc" -ne 0 ]; then fail=$((fail + 1)); echo "FAIL: tools/arm_icount.sh exited $rc"; finish; fi
for kernel in dot rows gemv1 gemm pack; do
    for type in f16 bf16 q4_k; do
        [ "$kernel.$type" = rows.q4_k ] && continue # (the ARM sets have no multi-row Q4_K kernel)
        if echo "$out" | grep -Eq "^$kernel +$type +[0-9]+\.[0-9]{3}\$"; then pass=$((pass + 1))
        else fail=$((fail + 1)); echo "FAIL: no count for $kernel $type"; fi
    done
done
if ! $qemu -h 2>/dev/null | grep -q -- '^-plugin'; then skip=$((skip + 1)); echo "skipped: $qemu takes no plugins"; finish; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/loop.c" <<'EOF'
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 0;
    __asm__ volatile("1: add x1, x1, #1\n subs %0, %0, #1\n b.ne 1b" : "+r"(n) : : "x1", "cc");
    return 0;
}
EOF
if ! ${HOST_CC:-cc} -O2 -Wall -Wextra -Werror -shared -fPIC "$(dirname "$0")/../tools/qemu_icount.c" -o "$tmp/icount.so" ||
   ! $cc -O2 -static "$tmp/loop.c" -o "$tmp/loop"; then
    fail=$((fail + 1)); echo "FAIL: could not build tools/qemu_icount.c or its test program"; finish
fi
counts=
for n in 1000 2000 5000; do
    counts="$counts $($qemu -plugin "$tmp/icount.so" "$tmp/loop" $n 2>&1 >/dev/null | sed -n 's/^icount: //p')"
done
echo "qemu_icount: loop of 1000, 2000, 5000:$counts instructions"
set -- $counts
if [ $# -eq 3 ] && [ $(($2 - $1)) -eq 3000 ] && [ $(($3 - $1)) -eq 12000 ]; then pass=$((pass + 1))
else fail=$((fail + 1)); echo "FAIL: qemu_icount counted$counts (3000 and 12000 apart expected)"; fi
total=$($qemu -plugin "$tmp/icount.so,prof=$tmp/prof.txt" "$tmp/loop" 5000 2>&1 >/dev/null | sed -n 's/^icount: //p')
sum=$(awk '{ s += $2 } END { print s + 0 }' "$tmp/prof.txt" 2>/dev/null)
loop=$(awk '$2 == 15000 || $2 == 14997 { n++ } END { print n + 0 }' "$tmp/prof.txt" 2>/dev/null)
echo "qemu_icount prof=: $total instructions, the blocks' sum $sum, the loop's blocks: $loop"
if [ -n "$total" ] && [ "$sum" = "$total" ] && [ "$loop" -ge 1 ]; then pass=$((pass + 1))
else fail=$((fail + 1)); echo "FAIL: qemu_icount prof= (its blocks must add up to the total, the loop's to 15000)"; fi
finish
