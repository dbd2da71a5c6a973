#!/usr/bin/env bash
# Configures and builds moekit into ${BUILD_DIR:-build} (Release, Ninja, ccache when present).
# Extra arguments go to the CMake configure step (e.g. -DMOEKIT_CUDA=OFF). MOEKIT_WERROR=ON makes
# warnings errors (CI sets it: .ci/run); users' builds keep them warnings, so a newer compiler's
# new warning cannot break an install.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
# ccache: hash paths relative to the checkout so a fresh clone elsewhere (CI) reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_WERROR="${MOEKIT_WERROR:-OFF}" "$@"
cmake --build "$BUILD_DIR" -j "${MOEKIT_JOBS:-$(nproc)}"
