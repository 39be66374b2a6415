#!/bin/sh
# tests/cli_sha256.sh — `pensieve sha256` must print exactly what coreutils `sha256sum` prints
# (stdout byte for byte, and the same exit status) for: every file size 0..1000 in one
# invocation, a 100 MB file, standard input, awkward names, and unreadable arguments.
# Needs $PSV_BIN (the pensieve binary). Ends with `N passed, N failed, N skipped`.

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
finish() { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }

if [ -z "$PSV_BIN" ] || [ ! -x "$PSV_BIN" ]; then
    bad "PSV_BIN is not set to an executable (got '$PSV_BIN')"; finish
fi
if ! command -v sha256sum >/dev/null 2>&1; then
    skip=$((skip + 1)); echo "skipped: sha256sum (coreutils) is not installed: nothing to compare with"
    finish
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/psv_cli_sha256.XXXXXX") || { bad "mktemp -d failed"; finish; }
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP
cd "$tmp" || { bad "cd $tmp"; finish; }

# same_as_sha256sum DESCRIPTION ARGS... — run both tools with ARGS, stdin from $stdin_file and
# pensieve with PSV_KERNELS=$kernels when set; compare stdout byte for byte and the exit status.
stdin_file=/dev/null
kernels=
same_as_sha256sum() {
    what=$1; shift
    env ${kernels:+PSV_KERNELS=$kernels} "$PSV_BIN" sha256 "$@" <"$stdin_file" >ours.out 2>ours.err; ours_rc=$?
    sha256sum "$@" <"$stdin_file" >theirs.out 2>theirs.err; theirs_rc=$?
    if ! cmp -s ours.out theirs.out; then
        bad "$what: output differs from sha256sum"; diff ours.out theirs.out | head -n 10
    elif [ "$ours_rc" -ne "$theirs_rc" ]; then
        bad "$what: exit status $ours_rc, sha256sum gives $theirs_rc"; cat ours.err
    else
        ok
    fi
}

# Sizes 0..1000: each a prefix of one random pool, so every padding case appears once.
head -c 1000 /dev/urandom >pool
names=
n=0
while [ $n -le 1000 ]; do
    head -c $n pool >"f$n"
    names="$names f$n"
    n=$((n + 1))
done
# shellcheck disable=SC2086 # names has no spaces: one argument per file
same_as_sha256sum "sizes 0..1000" $names
kernels=ref
# shellcheck disable=SC2086
same_as_sha256sum "sizes 0..1000 with PSV_KERNELS=ref" $names
kernels=
if [ "$ours_rc" -eq 0 ]; then ok; else bad "sizes 0..1000: exit status $ours_rc, want 0"; fi

head -c 100000000 /dev/urandom >big
same_as_sha256sum "100 MB file" big

# Standard input: implicit, explicit "-", a pipe, and "-" twice (the second read sees EOF).
stdin_file=f777
same_as_sha256sum "stdin (no FILE)"
same_as_sha256sum "stdin as -" -
same_as_sha256sum "stdin twice" - f1 -
stdin_file=/dev/null
same_as_sha256sum "empty stdin" -
ours=$(head -c 3000000 big | "$PSV_BIN" sha256 -)
theirs=$(head -c 3000000 big | sha256sum -)
if [ "$ours" = "$theirs" ]; then ok; else bad "stdin from a pipe: '$ours' vs '$theirs'"; fi

# Names: spaces, a leading dash after --, and the ones sha256sum escapes (\ \n \r).
cp f100 "a name with  spaces.bin"
cp -- f101 "-dash"
cp f102 "back\\slash"
cp f103 "new
line"
cp f104 "$(printf 'carriage\rreturn')"
same_as_sha256sum "name with spaces" "a name with  spaces.bin"
same_as_sha256sum "name after --" -- "-dash" f5
same_as_sha256sum "names escaped by sha256sum" "back\\slash" "new
line" f6
# \r: escaped since coreutils 9.0, as pensieve does; an older sha256sum (Debian 11's 8.32)
# prints it raw, so there the line is checked against the digest sha256sum gives.
cr="$(printf 'carriage\rreturn')"
case "$(sha256sum -- "$cr")" in
\\*) same_as_sha256sum "name with a carriage return" "$cr" ;;
*)
    want="\\$(sha256sum <"$cr" | cut -c1-64)  carriage\\rreturn"
    got=$("$PSV_BIN" sha256 -- "$cr")
    if [ "$got" = "$want" ]; then ok; else bad "name with a carriage return: '$got', want '$want'"; fi
    ;;
esac

# Unreadable arguments: reported, skipped, exit status 1, the others still hashed.
mkdir adir
same_as_sha256sum "missing file among good ones" f10 missing-file f11
if [ "$ours_rc" -eq 1 ]; then ok; else bad "missing file: exit status $ours_rc, want 1"; fi
if grep -q '^pensieve sha256: missing-file: ' ours.err; then ok; else
    bad "missing file: stderr should start 'pensieve sha256: missing-file: ', got: $(cat ours.err)"
fi
same_as_sha256sum "directory" adir f12
if [ "$ours_rc" -eq 1 ]; then ok; else bad "directory: exit status $ours_rc, want 1"; fi

# Options.
if "$PSV_BIN" sha256 --help >help.out 2>&1 && grep -q '^usage: pensieve sha256' help.out; then ok
else bad "--help should print usage and exit 0"; fi
if PSV_KERNELS=ref "$PSV_BIN" sha256 --help | grep -q '(now: ref)'; then ok
else bad "PSV_KERNELS=ref should select the portable code"; fi
"$PSV_BIN" sha256 --bogus f1 >bogus.out 2>&1
rc=$?
if [ "$rc" -eq 2 ] && ! grep -q f1 bogus.out; then ok
else bad "unknown option: exit status $rc (want 2, before any output): $(cat bogus.out)"; fi

finish
