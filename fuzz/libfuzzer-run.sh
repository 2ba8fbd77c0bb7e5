#!/bin/sh
# CTest's run of one libFuzzer binary: FUZZER FOUND SEEDS [OPTIONS...], the
# inputs it finds kept in FOUND (emptied first), anything that fails beside
# it (FOUND.crash-..., FOUND.leak-...).
#
# libFuzzer prints a line for every input that adds coverage, hundreds in a
# run, and a failing test's output is read from its tail (CI keeps the
# tail): the report that says what failed would be lost in the middle. So
# the run writes to FOUND.log, and a failure prints that log without the
# progress lines.
#
# LeakSanitizer's check at exit is off (leak_check_at_exit=0): libFuzzer
# checks each input that allocates more than it frees, twice over, and the
# AddressSanitizer build's tests check at exit. At exit, with the machine
# loaded (make test runs the ThreadSanitizer tests beside these), the
# check's tracer, the thread that stops the others to read their stacks,
# was seen to die of a segmentation fault ("Tracer caught signal 11 ...
# LeakSanitizer has encountered a fatal error"), after all 10000 inputs
# had passed: a failure of the sanitizer's, with no input behind it.
set -u
LSAN_OPTIONS="leak_check_at_exit=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export LSAN_OPTIONS
fuzzer=$1 found=$2 seeds=$3
shift 3
rm -rf "$found" "$found".crash-* "$found".leak-* "$found".oom-* "$found".timeout-* &&
  mkdir -p "$found" || exit 1
log=$found.log
"$fuzzer" "$@" -seed=1 -artifact_prefix="$found." "$found" "$seeds" >"$log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "$fuzzer exited with $rc; the whole log: $log"
  grep -v -e '^#[0-9]' -e '^[[:space:]]*NEW_FUNC' "$log"
else
  tail -n 1 "$log"
fi
exit "$rc"
