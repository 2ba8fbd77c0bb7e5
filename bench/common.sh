# Sourced by the bench scripts: the build directory ($1), the rounds ($2, or
# the script's default in $default_rounds), the repository as the working
# directory, and how to run workers: Open MPI as root, oversubscribed over
# shared memory, one BLAS thread per worker.
set -eu
build=${1:-build}
rounds=${2:-$default_rounds}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun="mpirun --oversubscribe --bind-to none --mca btl self,vader"
# need_root WHY: the scripts that make namespaces or cgroups say so and stop
need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "bench/$(basename "$0"): needs root ($1)" >&2
    exit 1
  fi
}
