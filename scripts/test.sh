#!/usr/bin/env bash
# Builds moekit and runs the whole test suite (GoogleTest + CLI contract tests + install check).
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${MOEKIT_JOBS:-$(nproc)}"
