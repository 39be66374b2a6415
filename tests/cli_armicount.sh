#!/bin/sh
# tests/cli_armicount.sh — tools/arm_icount.sh, which counts the ARM sets' F16 and BF16 kernels'
# instructions under qemu (PERFORMANCE.md, twenty-seventh session), and their quantized kernels since the
# twenty-ninth, builds and runs: it reports a count for every kernel and type (the tool itself
# checks each result against the reference), for the neon set (Q4_K: all but rows), with $ARM_CC
# and $QEMU (make test-arm64 passes them). Skipped where either is missing.
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
finish
