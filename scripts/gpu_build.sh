#!/usr/bin/env bash
# Builds moekit with the CUDA backend (sm_90a) on this machine and stages what a GPU run needs in
# .gpu/ (git-ignored): the `moekit` CLI and the test binary, stripped and xz-compressed. Carry `.gpu` to the GPU machine and run
# scripts/gpu_run.sh there (the device tool copies the working tree; .gpu travels as a carried path).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build} bash scripts/build.sh -DMOEKIT_CUDA=ON
B=${BUILD_DIR:-build}
rm -rf .gpu && mkdir -p .gpu
cp "$B/moekit" "$B/tests/moekit_tests" .gpu/
# Stripped and xz-compressed (~55 MB -> ~10 MB): the working tree that travels (models/ included)
# must stay under the device tool's 64 MiB; scripts/gpu_run.sh unpacks them there.
strip .gpu/moekit .gpu/moekit_tests
xz -T0 -6 .gpu/moekit .gpu/moekit_tests
du -sh .gpu
