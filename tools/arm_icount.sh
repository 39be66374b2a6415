#!/bin/sh
# Instructions a product (a weight value for pack) of an ARM set's kernels, counted under qemu (see
# tools/arm_icount.c): dot (vec_dot, one weight row by one activation row: products of two and
# three rows where a set has no other kernel), rows (vec_dot_rows) and gemv (with the rows' side
# data: products of two and three rows), gemv1 (generation), gemm (prompts), pack (gemm's panels).
#   tools/arm_icount.sh [SET [TYPE...]]    SET: neon (default), dotprod, i8mm; TYPE: f16 bf16
#                                          (default), q4_0, q4_k, q6_k, ...
# MODES (default "dot rows gemv gemv1 gemm pack") chooses the kernels; ARM_CC (default
# aarch64-linux-gnu-gcc; clang: ARM_CC="clang --target=aarch64-linux-gnu -isystem
# /usr/aarch64-linux-gnu/include -fuse-ld=bfd") and QEMU (default qemu-aarch64) the tools.
# "-": the set has no such kernel for the type. Exits 1 if any result differs from the reference.
set -e
SET=${1:-neon}
[ $# -gt 0 ] && shift
TYPES=${*:-f16 bf16}
ARM_CC=${ARM_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
$ARM_CC -O2 -std=c11 -static -I. tools/arm_icount.c -o "$out/arm_icount" -lpthread -lm
# The instructions the run executes; its exit status. qemu logs each translation block's
# instructions once (in_asm) and each execution of a block (exec; nochain: every one, chained or
# not), so the count is the sum over executions of the executed block's length: the same count as
# one block per instruction (-singlestep, one log line per instruction executed; checked equal on
# every kernel and type of the three sets), with a log a fifth the size, 4-6 times sooner.
count() {
    $QEMU -d in_asm,exec,nochain -D "$out/log" "$out/arm_icount" "$@" || return $?
    awk '/^IN:/ { blk = 1; start = ""; n = 0; next }
         blk && /^0x[0-9a-f]+:/ { if (start == "") { start = substr($1, 3, length($1) - 3); sub(/^0+/, "", start) } n++; next }
         blk && (/^$/ || /^Trace / || /^-/) { size[start] = n; blk = 0 }
         /^Trace / { split($4, f, "/"); pc = f[2]; sub(/^0+/, "", pc); if (!(pc in size)) bad = 1; total += size[pc] }
         END { if (bad) { print "arm_icount.sh: a block ran that the log did not show translated" > "/dev/stderr"; exit 1 }
               print total }' "$out/log"
}
wrong=0
printf '%-6s %-5s %s\n' kernel type "instructions a product (pack: a value)"
for mode in ${MODES:-dot rows gemv gemv1 gemm pack}; do
    for type in $TYPES; do
        rc=0
        one=$(count $mode $type "$SET" 1) && two=$(count $mode $type "$SET" 2) || rc=$?
        case $rc in
        0) # 1024 values x 8 weight rows (x 6 activation rows)
            case $mode in gemv1|pack) units=8192 ;; *) units=49152 ;; esac
            printf '%-6s %-5s %s\n' $mode $type "$(awk -v d=$((two - one)) -v u=$units 'BEGIN { printf "%.3f", d / u }')" ;;
        3) printf '%-6s %-5s %s\n' $mode $type - ;;
        *) printf '%-6s %-5s %s\n' $mode $type "failed (exit $rc)"; wrong=1 ;;
        esac
    done
done
exit $wrong
