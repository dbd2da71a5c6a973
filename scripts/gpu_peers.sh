#!/usr/bin/env bash
# On the GPU machine, from the repository root: moekit's default rows and the peers of issue 32
# (scripts/bench_peers.py: torch._grouped_mm, torch._scaled_grouped_mm, DeepGEMM composed MoEs and
# DeepGEMM's two GEMMs alone) on the same presets and token counts, in one device call, so the CSVs
# compare like for like; then the table (scripts/peers_table.py).
# DeepGEMM travels as .peers/deep_gemm.tar.xz (the copy inside vLLM 0.33.0's PyPI wheel,
# vllm/third_party/deep_gemm; `pip download --no-deps vllm==0.33.0` and tar it), unpacked to /tmp.
# Writes $OUT/moekit.csv (with stream_us / frac_stream: the weights read alone, docs/cli.md),
# $OUT/peers.csv, $OUT/peers_table.md and the logs.
#   MODELS=mixtral,deepseek-v3,qwen3-moe TOKENS=1,8,64,512,4096 ITERS=20 GPU_DIR=.gpu
#   BASELINE=1     also time moekit bench's unfused cuBLAS baseline (its baseline_us / vs_baseline
#                  columns; default 0: --no-baseline, as before)
#   DEADLINE=570   seconds from the start by which everything has ended (the device call allows 600)
#   PEERS_BUDGET=N bench_peers.py --budget-s (default: what DEADLINE leaves after moekit, less 90 s)
# Expected time at the defaults (unverified until the next run): moekit's 9 runs ~180 s (the
# 2026-12-03 call), then bench_peers.py in what is left (--budget-s ~290 s): ~10 s start, the DeepGEMM
# JIT warm-up (about 60 NVCC compiles, 12 at a time: a minute or two, capped at 180 s), ~90 s of torch
# peers, ~60 DeepGEMM cells at < 1 s each: 7-8 minutes in all, 9.5 at most (DEADLINE). BASELINE=1
# lengthens the moekit runs (by an unmeasured amount) and leaves the peers that much less: the last
# cells (qwen3-moe) are then written skipped with "--budget-s ... spent" rather than overrunning.
# Order: moekit first, so its rows never depend on how long DeepGEMM's JIT takes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${GPU_DIR:-.gpu}
for f in $B/*.xz; do [ -e "$f" ] && unxz -f -T0 "$f"; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MODELS=${MODELS:-mixtral,deepseek-v3,qwen3-moe}
TOKENS=${TOKENS:-1,8,64,512,4096}
DEADLINE=${DEADLINE:-570}
NO_BASELINE=--no-baseline
MOEKIT_TIMEOUT=90
if [ "${BASELINE:-0}" = 1 ]; then NO_BASELINE=; MOEKIT_TIMEOUT=150; fi
# moekit's default rows: one run per (model, scheme), rows merged into moekit.csv.
T=$(mktemp -d)
for m in ${MODELS//,/ }; do
  for sc in bf16 fp8_channel fp8_block; do
    k=fused_moe_sm90_bf16; [ "$sc" != bf16 ] && k=fused_moe_sm90_fp8_row; [ "$sc" = fp8_block ] && k=fused_moe_sm90_fp8_block
    timeout $MOEKIT_TIMEOUT $B/moekit bench --op fused_moe --backend cuda --model "$m" --full --tokens "$TOKENS" --scheme "$sc" \
      --kernel $k --iters "${ITERS:-20}" $NO_BASELINE --csv "$T/moekit_${m}_$sc.csv" > "$T/moekit_${m}_$sc.txt" 2>&1
    echo "moekit $m $sc rc=$? at ${SECONDS}s"
  done
done
python3 - "$T" "$OUT/moekit.csv" <<'PY'
import csv, glob, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "moekit_*.csv"))):
    rows += list(csv.DictReader(open(f)))
keys = ["case", "scheme", "tokens", "kernel", "time_us", "frac_floor", "status", "reason",
        "baseline_us", "vs_baseline", "baseline_reason", "stream_us", "frac_stream"]
with open(sys.argv[2], "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
print(f"{sys.argv[2]}: {len(rows)} rows")
PY
tar -C "$T" -czf "$OUT/moekit_runs.tgz" .
# The peers, in what the deadline leaves (bench_peers.py starts no cell after --budget-s; a cell or
# the JIT warm-up's last compiles may run on for a minute after it, hence the 75 s of timeout).
if [ -f .peers/deep_gemm.tar.xz ]; then
  mkdir -p /tmp/peers && tar -xJf .peers/deep_gemm.tar.xz -C /tmp/peers
  export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
fi
BUDGET=${PEERS_BUDGET:-$((DEADLINE - SECONDS - 90))}
if [ "$BUDGET" -lt 30 ]; then
  echo "peers skipped: ${BUDGET}s of budget left at ${SECONDS}s"
else
  timeout $((BUDGET + 75)) python3 scripts/bench_peers.py --models "$MODELS" --tokens "$TOKENS" \
    --iters "${ITERS:-20}" --budget-s "$BUDGET" --out "$OUT/peers.csv" > "$OUT/peers.log" 2>&1
  echo "peers rc=$? (budget ${BUDGET}s) at ${SECONDS}s"
fi
python3 scripts/peers_table.py --moekit "$OUT/moekit.csv" --peers "$OUT/peers.csv" > "$OUT/peers_table.md"
echo "table rc=$?: $OUT/peers_table.md; total ${SECONDS}s"
