# What the end-to-end test scripts share: a scratch directory, removed at
# exit, and the tally of checks. Source it, then call ok or bad NAME for each
# check and finish with summary.
set -u
fail=0
pass=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
summary() { echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; }

# expect_fail NAME CODE PATTERN -- CMD...: exit CODE, stderr matches PATTERN.
expect_fail() {
  local name=$1 code=$2 pat=$3; shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne "$code" ] || ! grep -qE -- "$pat" "$tmp/err"; then
    bad "$name: exit $rc, stderr: $(cat "$tmp/err")"
  else ok; fi
}
# expect_grep NAME PATTERN -- CMD...: exit 0 and the output (stdout and stderr) matches
# PATTERN.
expect_grep() {
  local name=$1 pat=$2; shift 3
  local got; got=$("$@" 2>&1); local rc=$?
  if [ $rc -ne 0 ] || ! grep -qE -- "$pat" <<<"$got"; then
    bad "$name: exit $rc, output: $got"
  else ok; fi
}

# noise_idx DIR N M: an IDX dataset in DIR of N training and M test 8x8
# images of noise, labels 0-9 in turn.
noise_idx() {
  mkdir -p "$1"
  byte() { printf "\\x$(printf %02x "$1")"; }
  u32() { printf '\x00\x00'; byte $(($1 / 256)); byte $(($1 % 256)); }
  images() { { printf '\x00\x00\x08\x03'; u32 "$3"; u32 8; u32 8; head -c $(($3 * 64)) /dev/urandom; } > "$1/$2"; }
  labels() { { printf '\x00\x00\x08\x01'; u32 "$3"; for i in $(seq 0 $(($3 - 1))); do byte $((i % 10)); done; } > "$1/$2"; }
  images "$1" train-images-idx3-ubyte "$2"; labels "$1" train-labels-idx1-ubyte "$2"
  images "$1" t10k-images-idx3-ubyte "$3"; labels "$1" t10k-labels-idx1-ubyte "$3"
}

