#!/bin/sh
# tests/cli_mkmodel.sh — `pensieve mkmodel`: tiny models of every architecture and many tensor
# types are written, and `info`, `logits`, `run` and `tokenize` work on them (finite logits,
# chat template recognised); presets shrunk to tiny sizes keep their layout (tied embeddings,
# LongRoPE factors, partial rotary, q/k/v biases, type fallbacks); the same seed gives the same
# bytes; bad arguments exit 2 with a message. $PSV_BIN is the binary.
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
bin=${PSV_BIN:-./pensieve}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$bin" ]; then
    echo "skipped: $bin is not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if ! "$bin" mkmodel --help >"$tmp/o" 2>&1; then
    echo "skipped: this build has no mkmodel subcommand"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
grep -q "usage: pensieve mkmodel" "$tmp/o" && ok || bad "mkmodel --help"

tiny="--embd 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512"

# check_model FILE ARCH: the model works with the other subcommands.
check_model() {
    f=$1; a=$2
    "$bin" info "$f" >"$tmp/info" 2>&1 && grep -q "general.architecture .*\"$a\"" "$tmp/info" && ok || bad "info $f"
    if "$bin" logits -m "$f" --ids 1,2,3 >"$tmp/l" 2>"$tmp/e" && [ "$(grep -c '"lse":' "$tmp/l")" -eq 3 ] &&
        ! grep -qiE 'nan|inf|null' "$tmp/l"; then ok; else bad "logits $f: $(head -c 300 "$tmp/e" "$tmp/l")"; fi
    if "$bin" run -m "$f" --prompt-ids 1,2 -n 4 --ids --temp 0 >"$tmp/r" 2>"$tmp/e" && ! grep -qvE '^[0-9]+$' "$tmp/r"; then
        ok; else bad "run $f: $(head -c 300 "$tmp/e")"; fi
    "$bin" tokenize -m "$f" "Hello world, the quick brown fox" >"$tmp/t" 2>"$tmp/e" && grep -qE '[0-9]' "$tmp/t" && ok ||
        bad "tokenize $f: $(head -c 300 "$tmp/e")"
    # the chat template is recognised (no fallback warning) and the prompt evaluates
    "$bin" run -m "$f" --chat -p "hi" -n 2 --temp 0 --ids >/dev/null 2>"$tmp/e" && ! grep -q "falling back" "$tmp/e" && ok ||
        bad "run --chat $f: $(head -c 300 "$tmp/e")"
}

# every architecture with several types, the other types on llama
for a in llama phi3 qwen2 qwen3 phi2; do
    for t in F32 F16 BF16 Q8_0 Q4_0 Q4_K_M Q6_K; do
        if "$bin" mkmodel -q --arch $a $tiny --type $t -o "$tmp/$a-$t.gguf" 2>"$tmp/e"; then
            ok; check_model "$tmp/$a-$t.gguf" $a
        else
            bad "mkmodel --arch $a --type $t: $(cat "$tmp/e")"
        fi
        rm -f "$tmp/$a-$t.gguf"
    done
done
for t in Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q4_K_S Q5_K_S Q5_K_M q4_k_m; do
    if "$bin" mkmodel -q --arch llama $tiny --type $t -o "$tmp/t.gguf" 2>"$tmp/e"; then
        ok; check_model "$tmp/t.gguf" llama
    else
        bad "mkmodel --type $t: $(cat "$tmp/e")"
    fi
done

# the summary names what was written
"$bin" mkmodel --arch qwen2 $tiny --type Q4_K_M -o "$tmp/s.gguf" >"$tmp/o" 2>&1 &&
    grep -q "Q4_K" "$tmp/o" && grep -q "Q6_K" "$tmp/o" && grep -q "wrote" "$tmp/o" && ok || bad "summary: $(cat "$tmp/o")"
"$bin" mkmodel -q --arch qwen2 $tiny -o "$tmp/q.gguf" >"$tmp/o" 2>&1 && [ ! -s "$tmp/o" ] && ok || bad "-q prints nothing"

# phi4-mini layout at a tiny size: tied (no output.weight), 75 % rotary, LongRoPE factors
small="--layers 1 --embd 256 --heads 4 --kv-heads 2 --ffn 512 --vocab 1000"
if "$bin" mkmodel -q --preset phi4-mini $small -o "$tmp/p.gguf" 2>"$tmp/e"; then
    "$bin" info "$tmp/p.gguf" >"$tmp/info"
    grep -q "rope_factors_long.weight *F32 *24 " "$tmp/info" && grep -q "rope_factors_short.weight" "$tmp/info" && ok ||
        bad "phi4-mini: rope factors"
    ! grep -q " output.weight" "$tmp/info" && grep -q "token_embd.weight *Q6_K" "$tmp/info" && ok || bad "phi4-mini: tied Q6_K embeddings"
    grep -q "phi3.rope.dimension_count *UINT32 *48" "$tmp/info" && grep -q "original_context_length *UINT32 *4096" "$tmp/info" &&
        grep -q "attn_factor *FLOAT32 *1.19" "$tmp/info" && grep -q '"gpt-4o"' "$tmp/info" && ok || bad "phi4-mini: metadata"
    check_model "$tmp/p.gguf" phi3
else
    bad "mkmodel --preset phi4-mini: $(cat "$tmp/e")"
fi
"$bin" mkmodel -q --preset phi4-mini $small --untied -o "$tmp/p.gguf" && "$bin" info "$tmp/p.gguf" | grep -q " output.weight *Q6_K" &&
    ok || bad "--untied writes output.weight"
"$bin" mkmodel -q --preset phi4-mini $small --untied --pure --type Q4_0 -o "$tmp/p.gguf" &&
    "$bin" info "$tmp/p.gguf" | grep -q " output.weight *Q4_0" && ok || bad "--pure keeps the output in --type"

# qwen2-0.5b rows of 896 fall back to 32-blocks, and say so
if "$bin" mkmodel --preset qwen2-0.5b --layers 1 --vocab 1024 --type Q4_K_M -o "$tmp/q.gguf" >"$tmp/o" 2>&1; then
    grep -q "rows of 896 .*Q4_K.* stored as Q5_0" "$tmp/o" && ok || bad "qwen2 fallback note: $(cat "$tmp/o")"
    "$bin" info "$tmp/q.gguf" >"$tmp/info"
    grep -q "blk.0.attn_q.weight *Q5_0 *896 x 896" "$tmp/info" && grep -q "token_embd.weight *Q8_0" "$tmp/info" &&
        grep -q "blk.0.attn_q.bias" "$tmp/info" && grep -q "blk.0.ffn_down.weight *Q6_K *4864 x 896" "$tmp/info" &&
        ok || bad "qwen2 types"
    check_model "$tmp/q.gguf" qwen2
else
    bad "mkmodel --preset qwen2-0.5b: $(cat "$tmp/o")"
fi
# qwen3 keeps head_dim 128 apart from embd/heads
"$bin" mkmodel -q --preset qwen3-0.6b --layers 1 --vocab 600 --embd 256 --heads 4 --kv-heads 2 --ffn 256 -o "$tmp/q3.gguf" &&
    "$bin" info "$tmp/q3.gguf" | grep -q "qwen3.attention.key_length *UINT32 *128" && ok || bad "qwen3 key_length"
check_model "$tmp/q3.gguf" qwen3
"$bin" mkmodel -q --preset llama-1b --layers 1 --vocab 600 --embd 128 --heads 2 --kv-heads 1 --ffn 256 --type F16 -o "$tmp/l.gguf" &&
    "$bin" info "$tmp/l.gguf" | grep -q '"llama-bpe"' && ok || bad "llama-1b preset"
check_model "$tmp/l.gguf" llama

# determinism: the same seed gives identical bytes, another seed other bytes
"$bin" mkmodel -q --arch phi3 $tiny --seed 5 -o "$tmp/a.gguf" && "$bin" mkmodel -q --arch phi3 $tiny --seed 5 -o "$tmp/b.gguf" &&
    "$bin" mkmodel -q --arch phi3 $tiny --seed 6 -o "$tmp/c.gguf" || bad "determinism: mkmodel failed"
ha=$("$bin" sha256 "$tmp/a.gguf" | cut -d' ' -f1); hb=$("$bin" sha256 "$tmp/b.gguf" | cut -d' ' -f1)
hc=$("$bin" sha256 "$tmp/c.gguf" | cut -d' ' -f1)
[ -n "$ha" ] && [ "$ha" = "$hb" ] && ok || bad "same seed, different bytes"
[ "$ha" != "$hc" ] && ok || bad "different seeds, same bytes"

# usage errors: exit 2 with a message naming the problem
usage() { # usage PATTERN ARGS...
    pat=$1; shift
    "$bin" mkmodel "$@" >/dev/null 2>"$tmp/e"; rc=$?
    [ $rc -eq 2 ] && grep -q "pensieve mkmodel: .*$pat" "$tmp/e" && ok || bad "mkmodel $* -> exit $rc: $(cat "$tmp/e")"
}
o="-o $tmp/x.gguf"
usage "-o OUT.gguf" 
usage "-o OUT.gguf" --preset phi4-mini
usage "preset NAME or --arch" $o
usage "unknown --type 'Q9_9'" $o --preset phi4-mini --type Q9_9
usage "unknown --preset 'gpt5'" $o --preset gpt5
usage "unknown --arch 'gpt2'" $o --arch gpt2 $tiny
usage "contradicts" $o --preset phi4-mini --arch llama
usage "--embd is required" $o --arch llama --layers 2 --heads 4 --ffn 512 --vocab 512
usage "not a multiple of --kv-heads" $o --arch llama --embd 256 --layers 2 --heads 4 --kv-heads 3 --ffn 512 --vocab 512
usage "not a multiple of --heads" $o --arch llama --embd 250 --layers 2 --heads 4 --ffn 512 --vocab 512
usage "too small" $o --arch llama --embd 256 --layers 2 --heads 4 --ffn 512 --vocab 260
usage "--vocab must be an integer" $o --arch llama --embd 256 --layers 2 --heads 4 --ffn 512 --vocab 12x
usage "--layers must be an integer" $o --arch llama --embd 256 --layers 0 --heads 4 --ffn 512 --vocab 512
usage "rope-dims" $o --arch llama $tiny --rope-dims 63
usage "phi3 only" $o --arch llama $tiny --orig-ctx 1024
usage "exceeds --ctx" $o --arch phi3 $tiny --ctx 1024 --orig-ctx 4096
usage "unknown option '--bogus'" $o --arch llama $tiny --bogus
usage "bad or missing value for --seed" $o --arch llama $tiny --seed
[ ! -e "$tmp/x.gguf" ] && ok || bad "a refused command wrote a file"
# an unwritable output is a runtime error (exit 1) naming the path
"$bin" mkmodel --arch llama $tiny -o /nonexistent-dir/x.gguf >/dev/null 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "nonexistent-dir" "$tmp/e" && ok || bad "unwritable output -> exit $rc: $(cat "$tmp/e")"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
