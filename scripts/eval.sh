#!/usr/bin/env bash
# The main job: builds moekit, then evaluates the three bundled trained models (models/) on the
# CPU backend in bf16 and every fp8 scheme: one table row per model x backend x scheme (task,
# n-shot, exact match, stderr, logit agreement with the PyTorch model, tokens/s), a progress bar on
# stderr while it runs. About 5 minutes on 2 cores (1500 problems x 4 schemes), plus the build.
#   bash scripts/eval.sh                       # the whole table on the CPU
#   bash scripts/eval.sh --limit 100           # extra arguments go to `moekit eval`
#   bash scripts/eval.sh --backend cpu,cuda    # add the CUDA rows on a machine with an H200
# CMake options go through CMAKE_ARGS (e.g. CMAKE_ARGS=-DMOEKIT_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086
bash scripts/build.sh ${CMAKE_ARGS:-}
B=${BUILD_DIR:-build}
# The defaults of `moekit eval` are the bundled models (models/), the cpu backend and every scheme.
"$B/moekit" eval "$@"
