#!/usr/bin/env bash
# The installed tree, as someone outside this repository uses it: install
# the build into a scratch prefix, build examples/library/replicas.c against
# it with pkg-config (the shared library, then the static one), run both,
# and check that the shared library exports rp_ names only.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=1; echo "FAIL: $*" >&2; }
cmake --install "$build" --prefix "$tmp/inst" >/dev/null || { echo "FAIL: cmake --install" >&2; exit 1; }
pc=$(dirname "$(find "$tmp/inst" -name repipe.pc)")
lib=$(dirname "$pc")
export PKG_CONFIG_PATH=$pc
[ -x "$tmp/inst/bin/repipe" ] && [ -f "$tmp/inst/include/repipe/repipe.h" ] &&
  [ -f "$tmp/inst/share/man/man1/repipe.1" ] && [ -f "$tmp/inst/share/doc/repipe/library.md" ] ||
  bad "installed files: $(cd "$tmp/inst" && find . -type f | head -20)"
soname=$(objdump -p "$lib/librepipe.so" 2>/dev/null | awk '/SONAME/ { print $2 }')
[ "$soname" = "librepipe.so.0" ] || bad "soname: $soname"
cd "$tmp"
# shared
cc "$src/examples/library/replicas.c" $(pkg-config --cflags --libs repipe) -o shared 2>cc.err ||
  bad "build against the shared library: $(cat cc.err)"
out=$(LD_LIBRARY_PATH=$lib ./shared 2>&1)
grep -q "^2 workers, loss .* after 200" <<<"$out" && grep -q "^plan: " <<<"$out" &&
  [ -f replicas.rpw ] || bad "shared: $out"
# static: the archive and, behind it, what it needs (pkg-config --static)
cc "$src/examples/library/replicas.c" $(pkg-config --cflags repipe) "$lib/librepipe.a" \
   $(pkg-config --static --libs repipe | sed 's/-lrepipe//') -o static 2>cc.err ||
  bad "build against the static library: $(cat cc.err)"
out=$(./static 2>&1)
grep -q "^2 workers, loss .* after 200" <<<"$out" || bad "static: $out"
# the shared library's interface: rp_ names only
leaked=$(nm -D --defined-only "$lib/librepipe.so" | awk '$3 !~ /^rp_/ { print $3 }')
[ -z "$leaked" ] || bad "exported beyond rp_: $leaked"
# the Python package finds the library beside it
py=$(command -v /usr/bin/python3 || command -v python3)
out=$(cd "$tmp" && env -u REPIPE_LIBRARY PYTHONPATH="$lib/python3/dist-packages" "$py" -c \
      'import repipe; print(repipe.groups(4, 2))' 2>&1)
[ "$out" = "[0, 0, 1, 1]" ] || bad "installed Python package: $out"
# every module of the package is installed: the same files as the source's
for f in "$src"/python/repipe/*.py; do
  [ -f "$lib/python3/dist-packages/repipe/$(basename "$f")" ] ||
    bad "python/repipe/$(basename "$f") not installed"
done
if [ -n "${REPIPE_TORCH_PYTHON:-}" ]; then  # and each imports from there, with PyTorch
  mods=$(cd "$src/python" && ls repipe/*.py | sed 's,/__init__.py,,; s,\.py$,,; s,/,.,' | tr '\n' ' ')
  out=$(cd "$tmp" && env -u REPIPE_LIBRARY PYTHONPATH="$lib/python3/dist-packages" \
        "$REPIPE_TORCH_PYTHON" -c "import importlib, sys
for m in sys.argv[1:]:
    assert importlib.import_module(m).__file__.startswith('$lib'), m
print('ok')" $mods 2>&1)
  [ "$out" = "ok" ] || bad "installed Python modules: $out"
fi
# where the built and installed programs look for libraries: never the
# current directory (an empty entry), which a padded build RPATH once held
for f in "$build/repipe" "$build/librepipe.so" "$tmp/inst/bin/repipe" "$lib/librepipe.so"; do
  rp=$(readelf -d "$f" | sed -n 's/.*(R.*PATH).*\[\(.*\)\]/\1/p')
  [ -n "$rp" ] && case ":$rp:" in
    *::*) bad "$f: its RUNPATH '$rp' has an empty entry, the current directory" ;;
  esac
done
out=$(cd "$tmp" && "$tmp/inst/bin/repipe" --version 2>&1) || bad "installed repipe --version: $out"
[ $fail = 0 ] && echo "installed tree: the library example built and ran, shared and static"
exit $fail
