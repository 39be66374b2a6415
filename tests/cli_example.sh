#!/bin/sh
# tests/cli_example.sh — tools/example.c, a program that uses only pensieve.h, generates the same
# greedy text as `pensieve run` on each reference model, and reports a bad model path cleanly.
BIN=${PSV_BIN:-./pensieve}
EX=${PSV_EXAMPLE:-./build/example}
SHARED=${PSV_SHARED:-../shared}
pass=0 fail=0 skip=0
out=$("$EX" /nonexistent.gguf hi 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "example: .*/nonexistent.gguf"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: bad path: $out" >&2; fi
if [ ! -d "$SHARED/reference/models" ]; then
    echo "skipped: example generation: $SHARED/reference is absent" >&2
    skip=1
else
    for m in llama-spm-q4km qwen2-q3km phi4mini-q4km phi2-f16; do
        f="$SHARED/reference/models/$m.gguf"
        a=$("$EX" "$f" "The quick brown fox" 16 --greedy 2>&1)
        b=$("$BIN" run -m "$f" -p "The quick brown fox" -n 16 --temp 0 2>&1)
        if [ -n "$a" ] && [ "$a" = "$b" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $m: example '$a' vs run '$b'" >&2; fi
    done
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
