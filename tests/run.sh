#!/bin/sh
# tests/run.sh BIN_DIR [SCRIPT...] — runs every test program in BIN_DIR and every given shell
# test, prints each one's output, and ends with the totals as `N passed, N failed, N skipped`.
# A program that crashes or prints no summary line counts as one failure, and so does one that
# runs longer than PSV_TEST_TIMEOUT seconds (default 1800: a hang names its test instead of
# using up CI's time: test_model under qemu-aarch64 has stopped with all its threads asleep,
# see README). PSV_TEST_SKIP="NAME ..." skips those tests and counts each as skipped (CI's
# sanitizer run leaves out the two that compile and check their own builds of pensieve.c).
bindir=$1; shift
limit=${PSV_TEST_TIMEOUT:-1800}
tmo=; command -v timeout >/dev/null 2>&1 && tmo="timeout $limit"
total_p=0; total_f=0; total_s=0
log=$(mktemp); trap 'rm -f "$log"' EXIT
run_one() {
    name=$1; shift
    echo "== $name"
    case " ${PSV_TEST_SKIP:-} " in *" $name "*)
        echo "skipped: $name (PSV_TEST_SKIP)"; total_s=$((total_s + 1)); return ;;
    esac
    t0=$(date +%s)
    $tmo "$@" >"$log" 2>&1; rc=$?
    cat "$log"
    echo "($name: $(($(date +%s) - t0)) s)"
    [ -n "$tmo" ] && [ "$rc" -eq 124 ] && echo "$name: still running after $limit s: stopped"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: no summary line (exit $rc): counted as 1 failure"
        total_f=$((total_f + 1)); return
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "$name: exit $rc with no failed check: counted as 1 failure"; f=1
    fi
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
}
for t in "$bindir"/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" ${PSV_TEST_WRAPPER:-} "$t"
done
for s in "$@"; do
    run_one "$(basename "$s")" sh "$s"
done
echo "== total"
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
