#!/bin/sh
# tests/cli_run.sh — `pensieve run` against ../shared/reference: for every case of every
# reference model, greedy generation (--temp 0 --ids) reproduces the reference gen_ids up to the
# first step whose reference margin is below 0.2 (the contract's near-tie rule), and in chat mode
# the prompt tokenizes to exactly the reference prompt_ids. Plus usage errors.
BIN=${PSV_BIN:-./pensieve}
SHARED=${PSV_SHARED:-../shared}
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# usage errors: exit 2 with a message
"$BIN" run >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "run without arguments should exit 2"
"$BIN" run -m x.gguf --prompt-ids 1,,2 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "bad --prompt-ids should exit 2"
"$BIN" run -m x.gguf -p hi --temp -1 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "negative --temp should exit 2"
out=$("$BIN" run -m /nonexistent.gguf -p hi 2>&1); [ $? -eq 1 ] && echo "$out" | grep -q "/nonexistent.gguf" && ok || bad "missing model: $out"
"$BIN" run --help | grep -q "usage: pensieve run" && ok || bad "run --help"

if [ ! -f "$SHARED/reference/README.md" ]; then
    echo "skipped: reference cases: $SHARED/reference is absent" >&2
    skip=$((skip + 1))
elif ! command -v python3 >/dev/null 2>&1; then
    echo "skipped: reference cases: python3 is needed to read the expected JSON" >&2
    skip=$((skip + 1))
else
    res=$(BIN="$BIN" SHARED="$SHARED" python3 - <<'PY'
import json, os, subprocess
B, S = os.environ['BIN'], os.environ['SHARED'] + '/reference'
for name in ['llama-spm-q4km', 'llama-spm-q40', 'phi3-q5km', 'qwen2-q3km', 'phi4mini-q4km', 'phi2-f16']:
    d = json.load(open(f'{S}/expected/{name}.json'))
    for c in d['cases']:
        lim = len(c['gen_ids'])
        for s, g in enumerate(c['gen_logits']):
            if g['top'][0][1] - g['top'][1][1] < 0.2:
                lim = s
                break
        args = ['--chat', '-p', c['text']] if c['mode'] == 'chat' else ['--prompt-ids', ','.join(map(str, c['prompt_ids']))]
        r = subprocess.run([B, 'run', '-m', f'{S}/models/{name}.gguf', '--temp', '0', '--ids', '--verbose-prompt',
                            '-n', str(len(c['gen_ids'])), '--ctx', '512'] + args, capture_output=True, text=True)
        got = [int(x) for x in r.stdout.split()]
        tag = f"{name}/{c['name']}"
        print(('ok' if r.returncode == 0 and got[:lim] == c['gen_ids'][:lim] else 'FAIL') + f' greedy {tag}: {lim} steps checked')
        if c['mode'] == 'chat':
            line = [l for l in r.stderr.splitlines() if l.startswith('prompt:')]
            ids = [int(x) for x in line[0].split(':')[2].split(',')] if line else []
            print(('ok' if ids == c['prompt_ids'] else 'FAIL') + f' chat prompt ids {tag}: {len(ids)} tokens')
PY
)
    echo "$res" | grep FAIL >&2
    pass=$((pass + $(echo "$res" | grep -c '^ok')))
    fail=$((fail + $(echo "$res" | grep -c '^FAIL')))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
