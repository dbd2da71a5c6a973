#!/usr/bin/env bash
# moekit inside vLLM: a virtual environment with the pinned vLLM from PyPI (it pins its own torch
# and transformers, so it cannot share scripts/test_python.sh's), `pip install .` (CPU backends)
# into it, then tests/python/test_vllm.py and test_api_vllm.py (vLLM's modular kernel, oracles,
# plugin loader and routing; docs/vllm.md). Prints how long each step took.
# Optional in scripts/test.sh (MOEKIT_VLLM_TESTS=1): the wheel and its dependencies are several GB.
#
#   scripts/test_vllm.sh [pytest args...]
# Environment:
#   VLLM_VENV=path        the virtual environment (default ~/.cache/moekit/venv-vllm)
#   VLLM_SPEC=vllm==0.33.0   what `pip install` gets when vllm is missing (the tested version)
#   PYTHON=python3        the interpreter that creates the venv
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-$HOME/.cache/moekit/venv-vllm}
PY=$VENV/bin/python
VLLM_SPEC=${VLLM_SPEC:-vllm==0.33.0}
total_start=$SECONDS

source scripts/step.sh  # step NAME COMMAND...: runs COMMAND and prints its duration

if [[ ! -x $PY ]]; then
  mkdir -p "$(dirname "$VENV")"
  step "create venv $VENV" "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
  step "pip install $VLLM_SPEC" "$PY" -m pip install -q "$VLLM_SPEC"
fi
"$PY" -c "import pytest, scikit_build_core" 2>/dev/null || step "pip install pytest scikit-build-core" \
  "$PY" -m pip install -q pytest "scikit-build-core>=0.10" ninja
# No build isolation: the extension must link the torch that vLLM pinned. Its own build folder, so
# scripts/test_python.sh's (another torch) is not rebuilt each time.
step "pip install . (CPU backends, against vLLM's torch)" env MOEKIT_CUDA=OFF \
  "$PY" -m pip install -q --no-build-isolation --no-deps --config-settings=build-dir=build-python/vllm .
step "pytest test_vllm.py test_api_vllm.py" "$PY" -m pytest -q -p no:cacheprovider --rootdir=. \
  tests/python/test_vllm.py tests/python/test_api_vllm.py "$@"
echo "== total: $((SECONDS - total_start)) s"
