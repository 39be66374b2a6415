#!/bin/sh
# tests/cli_armcpus.sh — the aarch64 test_simd ($PSV_ARM_TESTS/test_simd, which make test-arm64
# builds) under qemu emulating CPUs without the newer instructions: a Cortex-A72 (Armv8.0: no dot
# product, so the neon set is the best one; an sdot or usmmla in its kernels would stop the run
# with SIGILL, where qemu's default CPU has them all) and a Cortex-A76 (dot product, no int8
# matrix multiply: the dotprod set). Each run must choose that set and pass, checking that set's
# kernels only (PSV_TEST_SETS: the others run in make test-arm64's own test_simd, on qemu's default
# CPU). Skipped where qemu or the binary is missing. Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
qemu=${QEMU:-qemu-aarch64}
bin=${PSV_ARM_TESTS:-build/arm64/tests}/test_simd
if ! command -v "${qemu%% *}" >/dev/null 2>&1; then skip=2; echo "skipped: ${qemu%% *} is not installed"; finish; fi
if [ ! -x "$bin" ]; then skip=2; echo "skipped: no $bin (make test-arm64 builds it)"; finish; fi
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# the two runs side by side (each is one emulated thread most of the time), then checked in order
cpu_sets="cortex-a72:neon cortex-a76:dotprod" # CPU:the set it must choose
for cpu_set in $cpu_sets; do
    cpu=${cpu_set%%:*} set=${cpu_set#*:}
    { PSV_TEST_SETS=$set $qemu -cpu "$cpu" "$bin" >"$dir/$cpu.out" 2>&1; echo $? >"$dir/$cpu.rc"; } &
done
wait
for cpu_set in $cpu_sets; do
    cpu=${cpu_set%%:*} set=${cpu_set#*:} out=$dir/$cpu.out rc=$(cat "$dir/$cpu.rc" 2>/dev/null || echo 255)
    tail -n 3 "$out"
    if [ "$rc" -ne 0 ]; then
        fail=$((fail + 1)); echo "FAIL: test_simd on $cpu exited $rc"; grep -E 'FAIL|differ' "$out" | head -n 20
    elif ! grep -q "^cpu: best kernel set $set; active $set" "$out"; then
        fail=$((fail + 1)); echo "FAIL: test_simd on $cpu did not choose the $set set"
    else
        pass=$((pass + 1)); echo "ok: $cpu runs test_simd with the $set set"
    fi
done
finish
