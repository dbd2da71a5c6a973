#!/usr/bin/env bash
# Builds moekit with the CUDA backend (sm_90a) on this machine and stages what a GPU run needs in
# .gpu/ (git-ignored): the `moekit` CLI and the test binary, stripped and xz-compressed. Carry `.gpu` to the GPU machine and run
# scripts/gpu_run.sh there (the device tool copies the working tree; .gpu travels as a carried path).
# GPU_DIR (default .gpu; an absolute path for a second checkout, e.g. the other side of an A/B run
# with scripts/gpu_ab.sh: `GPU_DIR=$PWD/.gpu/b bash /path/to/other/checkout/scripts/gpu_build.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build} bash scripts/build.sh -DMOEKIT_CUDA=ON
B=${BUILD_DIR:-build}
G=${GPU_DIR:-.gpu}
rm -f "$G"/moekit "$G"/moekit_tests "$G"/moekit.xz "$G"/moekit_tests.xz && mkdir -p "$G"
cp "$B/moekit" "$B/tests/moekit_tests" "$G"/
# Stripped and xz-compressed (~55 MB -> ~10 MB): the working tree that travels (models/ included)
# must stay under the device tool's 64 MiB; scripts/gpu_run.sh unpacks them there.
strip "$G"/moekit "$G"/moekit_tests
xz -T0 -6 "$G"/moekit "$G"/moekit_tests
du -sh "$G"
# Kernels whose accumulators ptxas put in local memory (a large stack frame) or whose wgmma it
# serialized: silent slow-downs.
bash scripts/check_lmem.sh || echo "gpu_build.sh: WARNING: the kernels above have local-memory stack frames or serialized wgmma"
