#!/usr/bin/env bash
# The D1 probe of docs/design/fused_moe_decode.md on the GPU machine, from the repository root: builds
# tools/decode_d1_probe.cu with nvcc into /tmp and runs it (ARGS, e.g. "--only check" or "--reps 100");
# its stdout goes to $OUT/d1.txt (default out/), the build log (ptxas -v) and its stderr to $OUT/d1.log.
set -u
cd "$(dirname "$0")/.." && OUT=${OUT:-out} && mkdir -p "$OUT" || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -I include -Xptxas -v \
  tools/decode_d1_probe.cu -o /tmp/decode_d1_probe > "$OUT/d1.log" 2>&1 || { cat "$OUT/d1.log"; exit 1; }
# shellcheck disable=SC2086  # ARGS: words
timeout 120 /tmp/decode_d1_probe ${ARGS:-} > "$OUT/d1.txt" 2>> "$OUT/d1.log"; rc=$?
cat "$OUT/d1.txt" "$OUT/d1.log"; echo "gpu_d1.sh: probe rc=$rc"; exit $rc
