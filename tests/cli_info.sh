#!/bin/sh
# tests/cli_info.sh — `pensieve info` on every shared model and vocabulary (exit 0, full report),
# and on bad input (exit 1 with `pensieve info: FILE: message`). $PSV_BIN is the binary,
# $PSV_SHARED the shared data directory (skipped when absent).
bin=${PSV_BIN:-./pensieve}
shared=${PSV_SHARED:-../shared}
pass=0; fail=0; skip=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; sed 's/^/    /' "$tmp/err" 2>/dev/null | head -n 5; }

# run ARGS...: runs `pensieve info ARGS`, leaving stdout, stderr and the exit code in $tmp, $rc.
run() { "$bin" info "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }

run --help
if [ $rc -eq 0 ] && grep -q '^usage: pensieve info FILE' "$tmp/out"; then ok; else bad "info --help"; fi

run
if [ $rc -eq 1 ] && grep -q '^pensieve info: expected a FILE' "$tmp/err"; then ok; else bad "info without FILE"; fi

run "$tmp/missing.gguf"
if [ $rc -eq 1 ] && grep -q "^pensieve info: $tmp/missing.gguf: cannot open" "$tmp/err"; then ok; else bad "missing file"; fi

printf 'this is not a GGUF file, just some text\n' >"$tmp/garbage.gguf"
run "$tmp/garbage.gguf"
if [ $rc -eq 1 ] && grep -q "^pensieve info: $tmp/garbage.gguf: gguf: bad magic" "$tmp/err" && [ ! -s "$tmp/out" ]
then ok; else bad "garbage file"; fi

: >"$tmp/empty.gguf"
run "$tmp/empty.gguf"
if [ $rc -eq 1 ] && grep -q "^pensieve info: $tmp/empty.gguf: gguf: file is 0 bytes" "$tmp/err"; then ok; else bad "empty file"; fi

run "$tmp"
if [ $rc -eq 1 ] && grep -q "^pensieve info: $tmp: not a regular file" "$tmp/err"; then ok; else bad "directory"; fi

models=$(ls "$shared"/reference/models/*.gguf 2>/dev/null)
vocabs=$(ls "$shared"/conformance/tokenizer/*.gguf 2>/dev/null)
if [ -z "$models" ] || [ -z "$vocabs" ]; then
    echo "skipped: shared models and vocabularies: $shared is absent (set PSV_SHARED)"
    skip=$((skip + 1))
else
    for f in $models; do
        run "$f"
        if [ $rc -eq 0 ] && grep -q "^$f: GGUF v3" "$tmp/out" && grep -q '^  general.architecture ' "$tmp/out" &&
            grep -qE '^ +# +name +type +shape' "$tmp/out" && grep -qE '^ +0  ' "$tmp/out" &&
            grep -q '^  tensor bytes  ' "$tmp/out" && grep -q '^  parameters    ' "$tmp/out" && [ ! -s "$tmp/err" ]
        then ok; else bad "info $f"; fi
    done
    for f in $vocabs; do
        run "$f"
        if [ $rc -eq 0 ] && grep -q '^tensors: none' "$tmp/out" &&
            grep -qE '^  tokenizer\.ggml\.tokens +ARRAY +\[STRING x [0-9]+\] ' "$tmp/out" && [ ! -s "$tmp/err" ]
        then ok; else bad "info $f"; fi
    done

    # Known facts (reference/README.md) and the array summary format.
    f=$shared/reference/models/llama-spm-q4km.gguf
    run "$f"
    if grep -qE '^ +[0-9]+  token_embd\.weight +Q4_K +256 x 32000 ' "$tmp/out" &&
        grep -q '\[STRING x 32000\] "<unk>", "<s>", "</s>", ' "$tmp/out" &&
        grep -qE '^  general\.architecture +STRING +"llama"$' "$tmp/out"
    then ok; else bad "llama-spm-q4km facts"; fi

    # A truncated model fails with the file named, and several files are reported in turn.
    head -c 5000 "$f" >"$tmp/cut.gguf"
    run "$tmp/cut.gguf"
    if [ $rc -eq 1 ] && grep -q "^pensieve info: $tmp/cut.gguf: gguf: key 'tokenizer.ggml.tokens'" "$tmp/err"
    then ok; else bad "truncated model"; fi
    run "$f" "$tmp/garbage.gguf" "$shared/reference/models/phi2-f16.gguf"
    if [ $rc -eq 1 ] && [ "$(grep -c ': GGUF v3' "$tmp/out")" -eq 2 ] && grep -q 'bad magic' "$tmp/err"
    then ok; else bad "several files"; fi
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
