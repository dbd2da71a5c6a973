#!/usr/bin/env bash
# On the GPU machine, from the repository root: the peers of issue 32 (scripts/bench_peers.py:
# torch._grouped_mm, torch._scaled_grouped_mm, DeepGEMM) and moekit's default rows on the same
# presets and token counts, in one device call, so the two CSVs compare like for like.
# DeepGEMM travels as .peers/deep_gemm.tar.xz (the copy inside vLLM 0.33.0's PyPI wheel,
# vllm/third_party/deep_gemm; `pip download --no-deps vllm==0.33.0` and tar it), unpacked to /tmp.
# Writes $OUT/peers.csv, $OUT/moekit.csv and the logs.
#   MODELS=mixtral,deepseek-v3,qwen3-moe TOKENS=1,8,64,512,4096 ITERS=20 PEERS_BUDGET=180 GPU_DIR=.gpu
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${GPU_DIR:-.gpu}
for f in $B/*.xz; do [ -e "$f" ] && unxz -f -T0 "$f"; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MODELS=${MODELS:-mixtral,deepseek-v3,qwen3-moe}
TOKENS=${TOKENS:-1,8,64,512,4096}
if [ -f .peers/deep_gemm.tar.xz ]; then
  mkdir -p /tmp/peers && tar -xJf .peers/deep_gemm.tar.xz -C /tmp/peers
  export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
fi
timeout $((${PEERS_BUDGET:-180} + 120)) python3 scripts/bench_peers.py --models "$MODELS" --tokens "$TOKENS" \
  --iters "${ITERS:-20}" --budget-s "${PEERS_BUDGET:-180}" --out "$OUT/peers.csv" > "$OUT/peers.log" 2>&1
echo "peers rc=$?"
# moekit's default rows: one run per (model, scheme), rows merged into moekit.csv.
T=$(mktemp -d)
for m in ${MODELS//,/ }; do
  for sc in bf16 fp8_channel fp8_block; do
    k=fused_moe_sm90_bf16; [ "$sc" != bf16 ] && k=fused_moe_sm90_fp8_row; [ "$sc" = fp8_block ] && k=fused_moe_sm90_fp8_block
    timeout 90 $B/moekit bench --op fused_moe --backend cuda --model "$m" --full --tokens "$TOKENS" --scheme "$sc" --kernel $k \
      --iters "${ITERS:-20}" --no-baseline --csv "$T/moekit_${m}_$sc.csv" > "$T/moekit_${m}_$sc.txt" 2>&1
    echo "moekit $m $sc rc=$?"
  done
done
python3 - "$T" "$OUT/moekit.csv" <<'PY'
import csv, glob, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "moekit_*.csv"))):
    rows += list(csv.DictReader(open(f)))
keys = ["case", "scheme", "tokens", "kernel", "time_us", "frac_floor", "status"]
with open(sys.argv[2], "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
print(f"{sys.argv[2]}: {len(rows)} rows")
PY
tar -C "$T" -czf "$OUT/moekit_runs.tgz" .
