#!/bin/sh
# tests/run.sh BIN_DIR [SCRIPT...] — runs every test program in BIN_DIR and every given shell
# test, prints each one's output, and ends with the totals as `N passed, N failed, N skipped`.
# A program that crashes or prints no summary line counts as one failure, and so does one that
# runs longer than PSV_TEST_TIMEOUT seconds (default 1800: a hang names its test instead of
# using up CI's time: test_model under qemu-aarch64 has stopped with all its threads asleep,
# see README). PSV_TEST_SKIP="NAME ..." skips those tests and counts each as skipped (CI's
# sanitizer run leaves out the three that compile and check their own builds of pensieve.c).
# PSV_TEST_JOBS=N runs N tests at a time (default 1); the output is the same either way, each
# test's whole and in the same order, printed when it and the tests before it have ended.
bindir=$1; shift
limit=${PSV_TEST_TIMEOUT:-1800}
jobs=${PSV_TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "run.sh: PSV_TEST_JOBS must be a positive number (got '$jobs')"; exit 2 ;; esac
tmo=; command -v timeout >/dev/null 2>&1 && tmo="timeout $limit"
total_p=0; total_f=0; total_s=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/psv_run.XXXXXX") || { echo "run.sh: mktemp -d failed"; exit 2; }
trap 'rm -rf "$dir"' EXIT

# The tests, numbered, each one's path in $dir/N.path: first the $nprog programs, then the scripts.
n=0
add() { echo "$1" >"$dir/$n.path"; n=$((n + 1)); }
for t in "$bindir"/test_*; do
    [ -x "$t" ] && add "$t"
done
nprog=$n
for s in "$@"; do
    add "$s"
done
name_of() { basename "$(cat "$dir/$1.path")"; }
skipped() { case " ${PSV_TEST_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }

# Runs test N: its output in $dir/N.log, then "EXIT_STATUS SECONDS" in $dir/N.done; its process
# id in $dir/N.pid while it runs (a background job ignores Ctrl-C, so stop_all ends them).
run_one() {
    t0=$(date +%s)
    if [ "$1" -lt "$nprog" ]; then
        $tmo ${PSV_TEST_WRAPPER:-} "$(cat "$dir/$1.path")" >"$dir/$1.log" 2>&1 3>&- &
    else
        $tmo sh "$(cat "$dir/$1.path")" >"$dir/$1.log" 2>&1 3>&- &
    fi
    echo $! >"$dir/$1.pid"
    wait $!; rc=$?
    rm -f "$dir/$1.pid"
    { echo "$rc $(($(date +%s) - t0))" >"$dir/$1.tmp" && mv "$dir/$1.tmp" "$dir/$1.done"; } 2>/dev/null
}
stop_all() {
    kill "$launcher" 2>/dev/null
    for f in "$dir"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
}

# The launcher, in the background: a test starts when one of the $jobs slots (lines in a FIFO)
# is free, and gives its slot back when it ends.
mkfifo "$dir/slots" || { echo "run.sh: mkfifo failed"; exit 2; }
exec 3<>"$dir/slots"
i=0; while [ $i -lt "$jobs" ]; do echo >&3; i=$((i + 1)); done
(
    i=0
    while [ $i -lt $n ]; do
        if ! skipped "$(name_of $i)"; then
            read -r _ <&3
            (run_one $i; echo >&3) &
        fi
        i=$((i + 1))
    done
    wait
) &
launcher=$!
trap 'stop_all; exit 1' INT TERM HUP

# The report, in order.
i=0
while [ $i -lt $n ]; do
    name=$(name_of $i)
    echo "== $name"
    if skipped "$name"; then
        echo "skipped: $name (PSV_TEST_SKIP)"; total_s=$((total_s + 1)); i=$((i + 1)); continue
    fi
    while [ ! -f "$dir/$i.done" ]; do sleep 0.2; done
    read -r rc secs <"$dir/$i.done"
    log=$dir/$i.log
    cat "$log"
    echo "($name: $secs s)"
    i=$((i + 1))
    [ -n "$tmo" ] && [ "$rc" -eq 124 ] && echo "$name: still running after $limit s: stopped"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: no summary line (exit $rc): counted as 1 failure"
        total_f=$((total_f + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "$name: exit $rc with no failed check: counted as 1 failure"; f=1
    fi
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
done
wait "$launcher"
echo "== total"
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
