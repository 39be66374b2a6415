#!/bin/sh
# tests/cli_bench.sh — `pensieve bench` on a tiny generated model: --json prints one valid JSON
# object with the documented keys, the text mode prints the table and the summary lines, thread
# and size lists multiply the tests, --membw adds the bandwidth and roofline, bad flags exit 2.
# Measurements are reported, never asserted (no timing checks). $PSV_BIN is the binary.
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
bin=${PSV_BIN:-./pensieve}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if [ ! -x "$bin" ]; then
    echo "skipped: $bin is not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
if ! "$bin" bench --help >"$tmp/o" 2>&1 || ! "$bin" mkmodel --help >/dev/null 2>&1; then
    echo "skipped: this build has no bench or mkmodel subcommand"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
grep -q "usage: pensieve bench" "$tmp/o" && ok || bad "bench --help"

m="$tmp/m.gguf"
if ! "$bin" mkmodel -q --arch llama --embd 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --type Q4_0 -o "$m"; then
    bad "mkmodel"; echo "$pass passed, $fail failed, $skip skipped"; exit 1
fi

# JSON: one object with these keys; with python3 the structure is checked, else the keys grepped
"$bin" bench -m "$m" -p 8 -n 4 -r 2 --json >"$tmp/j" 2>"$tmp/e" && ok || bad "bench --json: $(cat "$tmp/e")"
"$bin" bench -m "$m" -p 8,4 -n 4 -r 2 -t 1,2 -s 1,3 --membw --json >"$tmp/j2" 2>"$tmp/e" && ok || bad "bench --membw --json: $(cat "$tmp/e")"
"$bin" bench --membw -t 1 --json >"$tmp/j3" 2>"$tmp/e" && ok || bad "bench --membw alone: $(cat "$tmp/e")"
"$bin" bench -m "$m" -p 4 -n 3 -r 1 -d 0,20 -s 1,2 --kv-type f16 --json >"$tmp/j4" 2>"$tmp/e" && ok || bad "bench -d: $(cat "$tmp/e")"
if command -v python3 >/dev/null 2>&1; then
    res=$(python3 - "$tmp/j" "$tmp/j2" "$tmp/j3" "$tmp/j4" <<'PY'
import json, sys
def check(cond, what):
    print(('ok ' if cond else 'FAIL ') + what)
a, b, c, d = (json.load(open(p)) for p in sys.argv[1:5])
keys = ['model', 'arch', 'file_bytes', 'model_bytes', 'params', 'weight_bytes_per_token', 'n_ctx', 'kv_type',
        'kv_bytes', 'kernels', 'cpu', 'n_cpus', 'reps', 'warmup', 'warm_start', 'peak_rss_bytes', 'membw', 'tests']
check(all(k in a for k in keys), 'top-level keys: missing %s' % [k for k in keys if k not in a])
check(a['arch'] == 'llama' and a['params'] > 0 and 0 < a['model_bytes'] < a['file_bytes'], 'model facts')
check(a['membw'] is None, 'no membw without --membw')
check(all(k in a['warm_start'] for k in ['seconds', 'open_seconds', 'prompt_seconds', 'prompt_tokens', 'threads'])
      and a['warm_start']['prompt_tokens'] == 16 and a['warm_start']['seconds'] > 0, 'warm_start')
check(a['peak_rss_bytes'] is None or a['peak_rss_bytes'] > 0, 'peak_rss_bytes')
t = a['tests']
check([x['name'] for x in t] == ['pp8', 'tg4'], 'tests pp8, tg4: %s' % [x['name'] for x in t])
for x in t:
    check(x['reps'] == 2 and len(x['samples_s']) == 2 and all(s > 0 for s in x['samples_s']), x['name'] + ' samples')
    check(x['tps_mean'] > 0 and x['tps_stddev'] >= 0, x['name'] + ' tokens/s')
check(t[0]['kind'] == 'pp' and t[0]['n_prompt'] == 8 and t[0]['n_gen'] == 0, 'pp fields')
check(t[1]['kind'] == 'tg' and t[1]['n_gen'] == 4 and t[1]['bytes_per_token'] >= a['weight_bytes_per_token']
      and t[1]['roofline'] is None and t[1]['bandwidth'] is None, 'tg fields')
check([(x['name'], x['threads'], x['seqs']) for x in b['tests']] ==
      [('pp8', 1, 1), ('pp4', 1, 1), ('tg4', 1, 1), ('tg4x3', 1, 3), ('pp8', 2, 1), ('pp4', 2, 1), ('tg4', 2, 1),
       ('tg4x3', 2, 3)], 'thread, size and sequence lists')
# three sequences: the weights are read once per step of three tokens
one, three = b['tests'][2], b['tests'][3]
check(abs((one['bytes_per_token'] - three['bytes_per_token']) - b['weight_bytes_per_token'] * 2 / 3) < 1,
      'tg4x3 bytes per token: %s vs %s' % (three['bytes_per_token'], one['bytes_per_token']))
check(three['n_gen'] == 4 and len(three['samples_s']) == 2 and three['tps_mean'] > 0, 'tg4x3 fields')
check(b['membw'] is not None and b['membw']['bytes_per_second'] > 0 and b['membw']['threads'] == 2, 'membw')
check(all(x['roofline'] > 0 for x in b['tests'] if x['kind'] == 'tg'), 'roofline with --membw')
# each tg test's roofline comes from the bandwidth read around it (bench_prober), not the first read
tg = [x for x in b['tests'] if x['kind'] == 'tg']
check(all(x['bandwidth'] > 0 and abs(x['roofline'] - x['tps_mean'] * x['bytes_per_token'] / x['bandwidth']) <= 1e-9 * x['roofline']
          for x in tg), 'roofline = tg t/s x bytes per token / its bandwidth')
check(len(set(x['bandwidth'] for x in tg)) > 1, 'tg tests have their own bandwidth reads: %s' % [x['bandwidth'] for x in tg])
check(all('bandwidth' not in x for x in b['tests'] if x['kind'] == 'pp'), 'no bandwidth for pp')
check(b['warm_start']['threads'] == 2, 'warm start uses the most threads')
check(c['model'] is None and c['membw']['bytes_per_second'] > 0 and c['tests'] == [], 'membw alone')
# -d: every test again with that many tokens in the KV cache first (llama-bench's names)
check([(x['name'], x['n_depth']) for x in d['tests']] ==
      [('pp4', 0), ('tg3', 0), ('tg3x2', 0), ('pp4 @ d20', 20), ('tg3 @ d20', 20), ('tg3x2 @ d20', 20)],
      '-d 0,20 tests: %s' % [(x['name'], x.get('n_depth')) for x in d['tests']])
check(all(x['n_depth'] == 0 for x in a['tests']), 'n_depth 0 without -d')
check(d['n_ctx'] >= 24 and d['kv_type'] == 'f16', '-d context: %s' % d['n_ctx'])
# at depth 20 a generated token reads 20 more positions of the cache
kv_pos = d['kv_bytes'] / d['n_ctx']
check(abs(d['tests'][4]['bytes_per_token'] - d['tests'][1]['bytes_per_token'] - 20 * kv_pos) < 1,
      'tg3 @ d20 bytes per token: %s vs %s' % (d['tests'][4]['bytes_per_token'], d['tests'][1]['bytes_per_token']))
check(all(x['tps_mean'] > 0 for x in d['tests']), '-d tokens/s')
PY
)
    echo "$res" | grep '^FAIL' 
    pass=$((pass + $(echo "$res" | grep -c '^ok'))); fail=$((fail + $(echo "$res" | grep -c '^FAIL')))
else
    echo "skipped: JSON structure (no python3); grepping keys instead"
    for k in '"tests":' '"tps_mean":' '"tps_stddev":' '"warm_start":' '"peak_rss_bytes":' '"model_bytes":' '"params":' \
             '"name":"pp8"' '"name":"tg4"'; do
        grep -q "$k" "$tmp/j" && ok || bad "json key $k"
    done
    grep -q '"bytes_per_second":' "$tmp/j2" && grep -q '"roofline":[0-9]' "$tmp/j2" && ok || bad "membw json"
    [ "$(wc -l <"$tmp/j")" -eq 1 ] && ok || bad "json is one line"
fi

# text mode: the table and the summary lines
"$bin" bench -m "$m" -p 8 -n 4 -r 2 --membw >"$tmp/t" 2>"$tmp/e" && ok || bad "bench text: $(cat "$tmp/e")"
grep -q "^| arch .* t/s .* roofline |" "$tmp/t" && ok || bad "table header"
grep -qE "^\| llama .* pp8 \| .*[0-9] ± [0-9]" "$tmp/t" && ok || bad "pp8 row"
grep -qE "^\| llama .* tg4 \| .*[0-9] ± [0-9].* % \|" "$tmp/t" && ok || bad "tg4 row with roofline"
"$bin" bench -m "$m" -p 0 -n 2 -r 1 -d 8 >"$tmp/t2" 2>"$tmp/e" && grep -qE "^\| llama .*\| tg2 @ d8 \| .*[0-9] ± [0-9]" "$tmp/t2" &&
    grep -qE "^\| arch .*\|  *test \|" "$tmp/t2" && ok || bad "tg2 @ d8 row: $(cat "$tmp/t2" "$tmp/e")"
for l in "warm start:" "peak memory:" "bytes read per generated token:" "memory bandwidth:"; do
    grep -q "^$l" "$tmp/t" && ok || bad "text line '$l'"
done
grep -qE "^memory bandwidth: [0-9.]+ GB/s .* at the start, [0-9.]+ to [0-9.]+ GB/s around the tg tests" "$tmp/t" && ok ||
    bad "bandwidth around the tg tests: $(grep '^memory bandwidth' "$tmp/t")"
"$bin" bench -m "$m" -p 0 -n 2 -r 1 --no-warmup --kv-type f16 --json >"$tmp/j" 2>"$tmp/e" && grep -q '"kv_type":"f16"' "$tmp/j" &&
    ! grep -q '"name":"pp' "$tmp/j" && ok || bad "-p 0 --kv-type f16: $(cat "$tmp/e")"

# usage errors exit 2, runtime errors 1
usage() { # usage PATTERN ARGS...
    pat=$1; shift
    "$bin" bench "$@" >/dev/null 2>"$tmp/e"; rc=$?
    [ $rc -eq 2 ] && grep -q "pensieve bench: .*$pat" "$tmp/e" && ok || bad "bench $* -> exit $rc: $(cat "$tmp/e")"
}
usage "-m MODEL is required"
usage "-m MODEL is required" -p 8
usage "unknown option '--bogus'" -m "$m" --bogus
usage "value for -p" -m "$m" -p abc
usage "value for -p" -m "$m" -p 1,,2
usage "value for -n" -m "$m" -n -1
usage "value for -t" -m "$m" -t 0
usage "value for -r" -m "$m" -r 0
usage "value for -s" -m "$m" -s 0
usage "value for -s" -m "$m" -s 65
usage "value for --kv-type" -m "$m" --kv-type q8
usage "value for -d" -m "$m" -d -1
usage "value for -d" -m "$m" -d x
usage "value for -m" -m
"$bin" bench -m "$tmp/missing.gguf" -p 1 -n 1 -r 1 >/dev/null 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "pensieve bench: .*missing.gguf" "$tmp/e" && ok || bad "missing model -> exit $rc: $(cat "$tmp/e")"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
