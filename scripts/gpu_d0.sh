#!/usr/bin/env bash
# The D0 microbenchmarks of docs/design/fused_moe_decode.md on the GPU machine, from the repository root:
# builds tools/decode_d0_probe.cu with nvcc into /tmp and runs it (ARGS, e.g. "--only 2 --reps 100");
# its stdout goes to $OUT/d0.txt (default out/), the build log and its stderr to $OUT/d0.log.
set -u
cd "$(dirname "$0")/.." && OUT=${OUT:-out} && mkdir -p "$OUT" || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -I include \
  tools/decode_d0_probe.cu -o /tmp/decode_d0_probe > "$OUT/d0.log" 2>&1 || { cat "$OUT/d0.log"; exit 1; }
# shellcheck disable=SC2086  # ARGS: words
timeout 120 /tmp/decode_d0_probe ${ARGS:-} > "$OUT/d0.txt" 2>> "$OUT/d0.log"; rc=$?
cat "$OUT/d0.txt" "$OUT/d0.log"; echo "gpu_d0.sh: probe rc=$rc"; exit $rc
