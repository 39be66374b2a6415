#!/bin/sh
# tests/cli_tokenize.sh — `pensieve tokenize` and `pensieve detokenize` against the conformance
# vocabularies: ids match lines of the .out files, ids round-trip through detokenize, errors
# exit non-zero with a message. $PSV_BIN is the binary, $PSV_SHARED the shared directory.
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
bin=${PSV_BIN:-./pensieve}
dir=${PSV_SHARED:-../shared}/conformance/tokenizer
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$bin" ]; then
    echo "skipped: $bin is not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi

# --help and usage errors work without shared data.
"$bin" tokenize --help >"$tmp/o" 2>&1 && grep -q "usage: pensieve tokenize" "$tmp/o" && ok || bad "tokenize --help"
"$bin" detokenize --help >"$tmp/o" 2>&1 && grep -q "usage: pensieve detokenize" "$tmp/o" && ok || bad "detokenize --help"
"$bin" tokenize --bogus >/dev/null 2>"$tmp/e"; [ $? -eq 2 ] && grep -q "pensieve tokenize:" "$tmp/e" && ok || bad "unknown option"
"$bin" tokenize -m "$tmp/missing.gguf" hi >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] && grep -q "pensieve tokenize:" "$tmp/e" && ok || bad "missing model"

if [ ! -f "$dir/ggml-vocab-gpt-2.gguf" ]; then
    echo "skipped: $dir is absent (set PSV_SHARED)"
    echo "$pass passed, $fail failed, 1 skipped"; [ "$fail" -eq 0 ]; exit
fi

# expect_line VOCAB LINE TEXT: ids of TEXT equal line LINE of VOCAB's .out (which has a
# leading space before every id).
expect_line() {
    want=$(sed -n "$2p" "$dir/ggml-vocab-$1.gguf.out")
    got=$("$bin" tokenize -m "$dir/ggml-vocab-$1.gguf" "$3")
    [ " $got" = "$want" ] && ok || bad "$1 line $2: got '$got', want '$want'"
}
# Lines 12 and 17 of every .out are "Hello world" and "Hello, world!" (see the .inp).
for v in gpt-2 gpt-2-pre-llama-bpe gpt-2-pre-qwen2 gpt-2-pre-gpt-4o llama-spm phi-3 falcon starcoder deepseek-coder; do
    expect_line "$v" 12 "Hello world"
    expect_line "$v" 17 "Hello, world!"
done

# -f FILE, stdin, --add-special, --parse-special
printf 'Hello world' >"$tmp/in.txt"
got=$("$bin" tokenize -m "$dir/ggml-vocab-llama-spm.gguf" -f "$tmp/in.txt"); [ "$got" = "15043 3186" ] && ok || bad "-f: $got"
got=$(printf 'Hello world' | "$bin" tokenize -m "$dir/ggml-vocab-llama-spm.gguf" -f -); [ "$got" = "15043 3186" ] && ok || bad "-f -: $got"
got=$("$bin" tokenize -m "$dir/ggml-vocab-llama-spm.gguf" --add-special "Hello world"); [ "$got" = "1 15043 3186" ] && ok || bad "--add-special: $got"
got=$("$bin" tokenize -m "$dir/ggml-vocab-gpt-2.gguf" --parse-special "a<|endoftext|>b"); [ "$got" = "64 50256 65" ] && ok || bad "--parse-special: $got"
got=$("$bin" tokenize -m "$dir/ggml-vocab-gpt-2.gguf" "a<|endoftext|>b"); [ "$got" != "64 50256 65" ] && ok || bad "special parsed by default"
got=$("$bin" tokenize -m "$dir/ggml-vocab-gpt-2.gguf" ""); [ "$got" = "" ] && ok || bad "empty text: $got"

# detokenize(tokenize(s)) == s, byte for byte (no trailing newline is added).
text='Hello, world!  Caf\303\251 na\303\257ve \346\227\245\346\234\254\350\252\236 \360\237\230\200 tabs	and
newlines'
printf "$text" >"$tmp/want"
for v in gpt-2 gpt-2-pre-gpt-4o llama-spm phi-3 mpt; do
    ids=$("$bin" tokenize -m "$dir/ggml-vocab-$v.gguf" -f "$tmp/want" | tr ' ' ',')
    "$bin" detokenize -m "$dir/ggml-vocab-$v.gguf" "$ids" >"$tmp/got" && cmp -s "$tmp/want" "$tmp/got" && ok || bad "$v round trip"
done
# BOS is rendered as text; the SPM prefix space stays after it.
"$bin" detokenize -m "$dir/ggml-vocab-llama-spm.gguf" "1,15043,3186" >"$tmp/got"; printf '<s> Hello world' | cmp -s - "$tmp/got" && ok || bad "detokenize with BOS"
"$bin" detokenize -m "$dir/ggml-vocab-gpt-2.gguf" "15496, 995" >"$tmp/got"; printf 'Hello world' | cmp -s - "$tmp/got" && ok || bad "ids with spaces"
"$bin" detokenize -m "$dir/ggml-vocab-gpt-2.gguf" "1,99999" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] && grep -q "out of range" "$tmp/e" && ok || bad "id out of range"
"$bin" detokenize -m "$dir/ggml-vocab-gpt-2.gguf" "1,x" >/dev/null 2>"$tmp/e"; [ $? -eq 2 ] && ok || bad "bad id list"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
