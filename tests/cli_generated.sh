#!/bin/sh
# tests/cli_generated.sh — generated sections of pensieve.c match their generators: rerunning
# tools/gen_unicode.py on this machine's Unicode data changes nothing.
pass=0 fail=0 skip=0
if ! command -v python3 >/dev/null 2>&1 || [ ! -f /usr/share/unicode/UnicodeData.txt ]; then
    echo "skipped: Unicode section: needs python3 and /usr/share/unicode (Debian unicode-data)" >&2
    skip=1
else
    tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
    cp pensieve.c "$tmp"
    if python3 tools/gen_unicode.py --update "$tmp" && cmp -s pensieve.c "$tmp"; then
        pass=1
    else
        fail=1; echo "FAIL: section 8 of pensieve.c differs from tools/gen_unicode.py output" >&2
    fi
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
