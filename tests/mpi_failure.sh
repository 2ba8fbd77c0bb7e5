#!/usr/bin/env bash
# Rank 2 of 4 fails while the others wait in a collective: mpirun must end
# within seconds, non-zero, with the failing rank's message.
# Usage: mpi_failure.sh TEST_BINARY MPIRUN [MESSAGE]
set -u
bin=$1
mpirun=$2
msg=${3:-rank 2: injected failure}
start=$(date +%s)
out=$(timeout 60 "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np 4 "$bin" --mpi --fail 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
echo "$out" | tail -5
echo "exit $rc after ${took}s"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ] && grep -q -- "$msg" <<<"$out"
