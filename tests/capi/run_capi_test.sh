#!/usr/bin/env bash
# Installs the C API from BUILD_DIR into a scratch prefix, builds every
# tests/capi/*.c as C11 (gcc -std=c11 -Wall -Werror) against the INSTALLED
# headers and library through pkg-config, and runs each under mpirun -n 2.
# Also checks that find_package(fdtrain) works on the installed package.
# Usage: run_capi_test.sh BUILD_DIR CC MPIRUN  (FD_CAPI_RANKS=n: world size, default 2)
set -euo pipefail
build=$1 cc=$2 mpirun=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
pcdir=$(dirname "$(find "$prefix" -name fdtrain.pc | head -1)")
export PKG_CONFIG_PATH=$pcdir
cflags=$(pkg-config --cflags fdtrain)
libs=$(pkg-config --libs fdtrain)
libdir=$(pkg-config --variable=libdir fdtrain)

# find_package(fdtrain) from a consumer project.
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(fdtrain 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE fdtrain::fdtrain)
CM
printf '#include <fdtrain/fd.h>\n#include "tm.h"\nint main(void) { return fd_rank() == -1 ? 0 : 1; }\n' \
  > "$tmp/consumer/main.c"
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" > "$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
cmake --build "$tmp/consumer/build" >> "$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
"$tmp/consumer/build/consumer"
echo "find_package(fdtrain): ok"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
status=0
for src in "$here"/*.c; do
  name=$(basename "$src" .c)
  # shellcheck disable=SC2086
  # FD_CAPI_SANITIZE: -fsanitize=... of a sanitizer build (tests/capi/CMakeLists.txt); the
  # program must carry the sanitizer runtime first, before the instrumented library.
  "$cc" -std=c11 -Wall -Wextra -Werror -pedantic ${FD_CAPI_SANITIZE:-} $cflags "$src" -o "$tmp/$name" \
    $libs -lm -Wl,-rpath,"$libdir"
  echo "== $name (mpirun -n ${FD_CAPI_RANKS:-2})"
  "$mpirun" --oversubscribe --bind-to none -n "${FD_CAPI_RANKS:-2}" "$tmp/$name" || status=1
done
exit $status
