#!/usr/bin/env bash
# Allreduce side by side: the local backend, the MPI backend and a bare
# MPI_Allreduce (Open MPI, shared memory), 4 MB and 64 MB, 2 and 4 workers,
# with the ratios. Usage: bench/comm.sh BUILD_DIR
set -eu
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp)
for w in 2 4; do
  "$build/bench/bench_comm" local $w >> "$out"
  mpirun --oversubscribe --bind-to none --mca btl self,vader -np $w "$build/bench/bench_comm" mpi >> "$out"
done
cat "$out"
echo
printf '%-16s %10s %12s %16s\n' case "local/MPI" "mpi/bare" "(time ratios)"
for w in 2 4; do
  for mb in 4 64; do
    t() { awk -v b="$1" -v w="$w" -v mb="$mb" '$1 == b && $2 == w && $4 == mb { print $6 }' "$out"; }
    l=$(t local); m=$(t mpi); b=$(t bare-mpi)
    awk -v l="$l" -v m="$m" -v b="$b" -v c="$w workers ${mb} MB" \
      'BEGIN { printf "%-16s %9.2fx %11.3f\n", c, b / l, m / b }'
  done
done
rm -f "$out"
