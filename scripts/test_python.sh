#!/usr/bin/env bash
# Builds and tests the moekit Python package the way a new user would: a virtual environment,
# torch from PyPI when it is missing, `pip install .`, then pytest (tests/python). Prints how long
# each step took. Not part of scripts/test.sh.
#
#   scripts/test_python.sh [pytest args...]
# Environment:
#   VENV=path          the virtual environment to create or reuse (default .venv-py, git-ignored);
#                      VENV=none uses $PYTHON itself (e.g. the GPU machine's python3 that holds torch)
#   PYTHON=python3     the interpreter that creates the venv (or is used, with VENV=none)
#   BUILD_ISOLATION=0  pip install --no-build-isolation --no-deps: for machines without network
#                      whose Python already holds torch and scikit-build-core (the GPU image)
#   TORCH_SPEC=torch   what `pip install` gets when torch is missing (e.g. "torch==2.15.0")
#   TRANSFORMERS_SPEC=transformers==5.24.0   installed when missing or (in a venv) another version
#   LM_EVAL_SPEC="lm-eval[hf]==0.4.13"   installed when lm_eval is missing (tests/python/test_lm_eval.py);
#                      LM_EVAL_SPEC=none skips it (that test then skips)
#   MOEKIT_CUDA=OFF    build the CPU backends only even where nvcc and a CUDA torch exist
#                      (default AUTO: the CUDA backend too when both are present)
#   CMAKE_BUILD_PARALLEL_LEVEL=N   build jobs (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-py}
PY=$VENV/bin/python
[[ $VENV == none ]] && PY=${PYTHON:-python3}
PIP_FLAGS=()
[[ ${BUILD_ISOLATION:-1} == 0 ]] && PIP_FLAGS=(--no-build-isolation --no-deps)
total_start=$SECONDS

source scripts/step.sh  # step NAME COMMAND...: runs COMMAND and prints its duration

if [[ $VENV != none && ! -x $PY ]]; then
  mkdir -p "$(dirname "$VENV")"
  step "create venv $VENV" "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  step "pip install ${TORCH_SPEC:-torch}" "$PY" -m pip install -q "${TORCH_SPEC:-torch}"
fi
if ! "$PY" -c "import pytest" 2>/dev/null; then
  step "pip install pytest" "$PY" -m pip install -q pytest
fi
# transformers: the MoE blocks tests/python/test_layer_hf.py compares MoELayer with.
# The pinned version is the one moekit.hf's parity tests ran against (TESTED_TRANSFORMERS).
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-transformers==5.24.0}
if ! "$PY" -c "import transformers" 2>/dev/null || [[ $VENV != none && $("$PY" -c "import transformers; print(transformers.__version__)") != "${TRANSFORMERS_SPEC#transformers==}" && $TRANSFORMERS_SPEC == transformers==* ]]; then
  step "pip install $TRANSFORMERS_SPEC" "$PY" -m pip install -q "$TRANSFORMERS_SPEC"
fi
# lm-eval (PyPI, its HF backend): the accuracy table's harness (scripts/lm_eval_table.py).
LM_EVAL_SPEC=${LM_EVAL_SPEC:-lm-eval[hf]==0.4.13}
if [[ $LM_EVAL_SPEC != none ]] && ! "$PY" -c "import lm_eval, accelerate" 2>/dev/null; then
  step "pip install $LM_EVAL_SPEC" "$PY" -m pip install -q "$LM_EVAL_SPEC"
fi
step "pip install . (libmoekit + torch.ops.moekit)" "$PY" -m pip install -q ${PIP_FLAGS[@]+"${PIP_FLAGS[@]}"} .
# `import moekit` finds the installed package: the sources live in python/moekit, not on sys.path.
step "pytest tests/python" "$PY" -m pytest -q -p no:cacheprovider --rootdir=. tests/python "$@"
echo "== total: $((SECONDS - total_start)) s"
