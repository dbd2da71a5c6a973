#!/usr/bin/env bash
# Builds moekit and runs the whole test suite: GoogleTest + CLI contract tests + install check
# (ctest), then the Python package's tests (scripts/test_python.sh: `pip install .` with the CPU
# backends into a virtual environment that holds torch from PyPI, then pytest tests/python).
# This is the README's test command; .ci/run calls exactly this.
#   MOEKIT_VENV=path       the Python tests' virtual environment (default ~/.cache/moekit/venv-py,
#                          outside the checkout: torch, a multi-GB download, is installed once per
#                          machine and reused by later runs and fresh clones)
#   MOEKIT_PYTHON_TESTS=0  skip the Python tests (no network, no torch wanted)
#   MOEKIT_VLLM_TESTS=1    also the vLLM plugin's tests (scripts/test_vllm.sh: its own venv with
#                          vLLM from PyPI, several GB; off by default)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${MOEKIT_JOBS:-$(nproc)}"
if [[ ${MOEKIT_PYTHON_TESTS:-1} != 0 ]]; then
  # NOTE: MOEKIT_CUDA=OFF: CI has no GPU (the CUDA extension is built and tested on the H200 by
  # scripts/gpu_run.sh's python step); the CUDA library itself was compiled by the build above.
  VENV=${MOEKIT_VENV:-$HOME/.cache/moekit/venv-py} MOEKIT_CUDA=OFF CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} \
    bash scripts/test_python.sh
fi
if [[ ${MOEKIT_VLLM_TESTS:-0} == 1 ]]; then
  CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} bash scripts/test_vllm.sh
fi
