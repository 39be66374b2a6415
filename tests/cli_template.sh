#!/bin/sh
# tests/cli_template.sh — `pensieve template`: output byte for byte, exit statuses and messages.
# $PSV_BIN is the pensieve binary, $PSV_SHARED the ../shared directory (parts needing it SKIP when
# it is absent). Ends with `N passed, N failed, N skipped`.
BIN=${PSV_BIN:-./pensieve}
SHARED=${PSV_SHARED:-../shared}
pass=0; fail=0; skip=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }

# expect NAME WANT_FILE ARGS...: stdout must equal WANT_FILE exactly and the exit status be 0.
expect() {
    name=$1; want=$2; shift 2
    "$BIN" template "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
    if [ "$rc" -ne 0 ]; then bad "$name: exit $rc: $(cat "$tmp/err")"; return; fi
    if cmp -s "$tmp/out" "$want"; then ok; else
        bad "$name: output differs"
        echo "  got:";  od -c "$tmp/out" | head -n 20
        echo "  want:"; od -c "$want" | head -n 20
    fi
}

# expect_fail NAME STATUS PATTERN ARGS...: exit STATUS, nothing on stdout, stderr matches PATTERN.
expect_fail() {
    name=$1; want_rc=$2; pattern=$3; shift 3
    "$BIN" template "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
    if [ "$rc" -ne "$want_rc" ]; then bad "$name: exit $rc, want $want_rc"; return; fi
    if [ -s "$tmp/out" ]; then bad "$name: wrote to stdout"; return; fi
    if grep -q -- "$pattern" "$tmp/err"; then ok; else bad "$name: stderr lacks '$pattern': $(cat "$tmp/err")"; fi
}

cat >"$tmp/conv.json" <<'JSON'
[{"role": "system", "content": "You are a helpful assistant"},
 {"role": "user", "content": "Hello"},
 {"role": "assistant", "content": "Hi there"},
 {"role": "user", "content": "Who are you"},
 {"role": "assistant", "content": "   I am an assistant   "},
 {"role": "user", "content": "Another question"}]
JSON
printf '[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}]' >"$tmp/ref.json"
printf '[{"role":"user","content":"caf\\u00e9 \\"quoted\\"\\nline"}]' >"$tmp/esc.json"

printf '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n' >"$tmp/chatml"
expect "chatml by name" "$tmp/chatml" --template chatml --messages "$tmp/conv.json"
expect "messages from stdin" "$tmp/chatml" --template chatml --messages - <"$tmp/conv.json"

printf '<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>' >"$tmp/llama3-nogen"
expect "llama3, --no-generation-prompt" "$tmp/llama3-nogen" --template llama3 --messages "$tmp/conv.json" --no-generation-prompt

printf '<|im_start|>user\ncaf\303\251 "quoted"\nline<|im_end|>\n<|im_start|>assistant\n' >"$tmp/esc"
expect "JSON escapes decoded" "$tmp/esc" --messages "$tmp/esc.json" --template chatml

# A Jinja template in a file, recognised by content: Phi-4-mini (no newline after role tags).
cat >"$tmp/phi4mini.jinja" <<'JINJA'
{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}
JINJA
printf '<|system|>You are a helpful assistant<|end|><|user|>Hello<|end|><|assistant|>Hi there<|end|><|user|>Who are you<|end|><|assistant|>   I am an assistant   <|end|><|user|>Another question<|end|><|assistant|>' >"$tmp/phi4mini"
expect "Jinja file (Phi-4-mini)" "$tmp/phi4mini" --template "$tmp/phi4mini.jinja" --messages "$tmp/conv.json"

# An unrecognised template: chatml, with a warning that names the fallback.
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}' >"$tmp/odd.jinja"
expect "unrecognised template falls back" "$tmp/chatml" --template "$tmp/odd.jinja" --messages "$tmp/conv.json"
if grep -q "falling back to chatml" "$tmp/err"; then ok; else bad "no fallback warning: $(cat "$tmp/err")"; fi

# The reference models' own templates (and the chatml fallback for one without).
if [ -f "$SHARED/reference/models/phi3-q5km.gguf" ]; then
    printf '<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nWhat is the capital of France?<|end|>\n<|assistant|>\n' >"$tmp/phi3"
    expect "-m phi3" "$tmp/phi3" -m "$SHARED/reference/models/phi3-q5km.gguf" --messages "$tmp/ref.json"
    printf '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' >"$tmp/qwen"
    expect "-m qwen2" "$tmp/qwen" -m "$SHARED/reference/models/qwen2-q3km.gguf" --messages "$tmp/ref.json"
    printf '<|system|>You are a helpful assistant.<|end|><|user|>What is the capital of France?<|end|><|assistant|>' >"$tmp/phi4m"
    expect "-m phi4mini" "$tmp/phi4m" -m "$SHARED/reference/models/phi4mini-q4km.gguf" --messages "$tmp/ref.json"
    expect "-m llama-spm (no template)" "$tmp/qwen" -m "$SHARED/reference/models/llama-spm-q40.gguf" --messages "$tmp/ref.json"
    if grep -q "no chat template" "$tmp/err"; then ok; else bad "no missing-template warning: $(cat "$tmp/err")"; fi
else
    skip=$((skip + 5)); echo "skipped: -m cases: $SHARED/reference/models is absent"
fi

# Errors.
printf '[{"role":"user"}]' >"$tmp/nocontent.json"
printf '[{"role":"user","content":"x"}' >"$tmp/badjson.json"
printf '[{"role":"tool","content":"x"}]' >"$tmp/tool.json"
expect_fail "unknown name lists the names" 1 "llama2-sys-strip" --template nosuch --messages "$tmp/conv.json"
expect_fail "message without content" 1 'missing "content"' --template chatml --messages "$tmp/nocontent.json"
expect_fail "bad JSON" 1 "json" --template chatml --messages "$tmp/badjson.json"
expect_fail "role the format lacks" 1 "role 'tool'" --template llama2 --messages "$tmp/tool.json"
expect_fail "no model nor template" 2 "exactly one" --messages "$tmp/conv.json"
expect_fail "no messages" 2 "messages" --template chatml
expect_fail "unknown option" 2 "unknown argument" --template chatml --messages "$tmp/conv.json" --bogus
"$BIN" template --help >"$tmp/out" 2>&1 && grep -q "usage: pensieve template" "$tmp/out" && ok || bad "--help"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
