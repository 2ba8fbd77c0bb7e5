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
