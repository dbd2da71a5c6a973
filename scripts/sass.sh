#!/usr/bin/env bash
# SASS and resource use of moekit's CUDA kernels on the development machine (no GPU needed): the
# kernels of OBJECT (an object file of the build, or a binary) whose mangled names match REGEX.
# cuobjdump and nvdisasm come from the CUDA toolkit when it has them, else from PyPI
# (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) into $MOEKIT_CACHE/cudatools. Offsets match the
# ones scripts/ncu_source.py prints, so a stall profile can be read against the code.
#   bash scripts/sass.sh build/CMakeFiles/moekit_cuda.dir/src/ops/fused_moe/fused_moe_sm90_grouped_fp8_block.cu.o \
#     'gemm1_blk_kernelILb1ELNS_10ActivationE0ELi128ELi256E'
#   RES=1: only the per-kernel registers, stack and shared memory (cuobjdump -res-usage).
set -euo pipefail
OBJ=${1:?usage: sass.sh OBJECT [REGEX]}
RE=${2:-.}
if ! command -v cuobjdump > /dev/null || ! command -v nvdisasm > /dev/null; then
  T=${MOEKIT_CACHE:-$HOME/.cache/moekit}/cudatools
  if [ ! -x "$T/nvidia/cu13/bin/nvdisasm" ]; then
    echo "sass.sh: installing cuobjdump and nvdisasm from PyPI into $T" >&2
    python3 -m pip install -q --no-deps --target "$T" "nvidia-cuda-cuobjdump==13.2.51" "nvidia-cuda-nvdisasm==13.2.51" >&2
  fi
  export PATH=$T/nvidia/cu13/bin:$PATH
fi
if [ "${RES:-0}" = 1 ]; then
  # "Function NAME:" then "REG:.. STACK:.. SHARED:.." lines: one line per matching kernel.
  cuobjdump -res-usage "$OBJ" | awk -v re="$RE" '/Function /{f = ($2 ~ re); name = $2} f && /REG:/{print name, $0; f = 0}'
  exit 0
fi
# cuobjdump -sass prints "Function : NAME" before each kernel's code; keep the matching ones, with
# the addresses and instructions and without the encodings.
cuobjdump -sass "$OBJ" | awk -v re="$RE" '
  /Function : /{keep = ($3 ~ re); if (keep) print "== " $3; next}
  keep && /\/\*[0-9a-f][0-9a-f][0-9a-f][0-9a-f]+\*\//{sub(/ *\/\* 0x[0-9a-f]+ \*\/ *$/, ""); gsub(/^ +/, ""); print}'
