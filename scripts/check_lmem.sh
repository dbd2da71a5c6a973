#!/usr/bin/env bash
# Lists the sm_90a kernels of the grouped fused_moe .cu files whose ptxas stack frame is larger than
# LIMIT bytes (default 64): an accumulator array that ptxas moved to local memory shows up here as a
# stack frame of hundreds of bytes with no spills, and costs a large share of a tensor-core kernel's
# speed (seen once: 512 bytes, ~2500 local loads and stores per CTA in the bf16 gemm1). The small
# spills some kernels have are below the limit. Also lists the kernels whose wgmma ptxas serialized
# (its C7511-C7515 "Potential Performance Loss" notes: each group waits for the previous one; seen
# in the per-row fp8 gemm1 since E120, docs/experiments.md E126). Exits 1 when a kernel is over the
# limit or serialized.
#   FILES="src/ops/fused_moe/X.cu ..." (default: the grouped .cu files)   LIMIT=64   NVCC=nvcc
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-64}
FILES=${FILES:-"src/ops/fused_moe/fused_moe_sm90_grouped.cu src/ops/fused_moe/fused_moe_sm90_grouped_fp8.cu src/ops/fused_moe/fused_moe_sm90_grouped_fp8_block.cu"}
T=$(mktemp -d /tmp/moekit_lmem.XXXXXX)
trap 'rm -rf "$T"' EXIT
i=0
for f in $FILES; do
  ( ${NVCC:-nvcc} -I include -I src -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -cubin \
      -Xptxas -v -x cu "$f" -o "$T/$i.cubin" > "$T/$i.log" 2>&1 || echo "$f" > "$T/$i.failed" ) &
  i=$((i + 1))
done
wait
if ls "$T"/*.failed > /dev/null 2>&1; then
  echo "check_lmem: nvcc failed on: $(cat "$T"/*.failed | tr '\n' ' ')"
  exit 1
fi
cat "$T"/*.log | python3 -c '
import re, subprocess, sys
limit, cur, bad, n, serial = int(sys.argv[1]), None, [], 0, []
demangle = lambda f: subprocess.run(["c++filt", f], capture_output=True, text=True).stdout.strip()
for line in sys.stdin:
    m = re.search(r"\((C751\d)\) Potential Performance Loss: wgmma.*function .(\S+).$", line.strip())
    if m:
        serial.append(f"{m.group(1)} wgmma serialized: {demangle(m.group(2))}")
        continue
    m = re.search(r"Compiling entry function .(\S+). for", line)
    if m:
        cur = m.group(1)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
    if m and cur:
        n += 1
        if int(m.group(1)) > limit:
            bad.append(f"{m.group(1)} bytes stack frame ({m.group(2)} spilled): {demangle(cur)}")
        cur = None
print(f"check_lmem: {n} kernels, {len(bad)} over {limit} bytes of stack frame, {len(serial)} with serialized wgmma")
for b in bad + serial:
    print("  " + b)
sys.exit(1 if bad or serial or n == 0 else 0)
' "$LIMIT"
