#!/usr/bin/env bash
# Runs the whole CUDA validation and benchmark on the GPU machine, from the repository root, with
# the binaries staged by scripts/gpu_build.sh in .gpu/. Writes logs, JSON and a CSV to $OUT
# (default out/): summary.txt first. Each step has its own time limit so a hang cannot eat the run.
#   STEPS="tests check sanitize bench ep" (default: all)   BENCH_TOKENS=1,8,64,512,4096
# NOTE: tests + check + sanitize take ~4-5 min and bench (bf16 + fp8) up to ~9 min: run them as two
# device calls (STEPS="tests check sanitize", then STEPS=bench) to stay within one call's 10 minutes.
# The ep step (expert parallelism over NCCL) runs on machines with >= 2 GPUs and says so otherwise.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
B=.gpu
export MOEKIT_TEST_DATA_DIR=$PWD/tests/data
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# libnccl: the toolkit's, else the one PyTorch's nvidia-nccl wheel ships.
NCCL_WHEEL=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_WHEEL" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$NCCL_WHEEL
# NVLink multicast stays off on these shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS=${STEPS:-"tests check sanitize bench ep"}
TOKENS=${BENCH_TOKENS:-1,8,64,512,4096}
S="$OUT/summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
# memcheck: the CUDA tests of the fused kernels and the graph test; racecheck (much slower): small
# shapes of every CUDA kernel that uses shared memory. Both fit the device tool's 10-minute call.
MEMCHECK_FILTER='FusedMoeSm90Grouped*:CudaGraph*:FusedMoeSm90SmallM.Edge*'
RACECHECK_FILTER='FusedMoeSm90Grouped.TOne:FusedMoeSm90Grouped.LongKLoops128RowMTiles:FusedMoeSm90Grouped.WeightOnInput128RowMTiles:FusedMoeSm90Grouped.G1U0:FusedMoeSm90Grouped.ExpertMask:FusedMoeSm90SmallM.BadIds*:SortTokens.CudaHandWorked*:TopkSoftmax.CudaEdge*:GroupedTopk.CudaEdge*:SigmoidTopk.CudaEdge*'

say "# moekit GPU run $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$S"
timeout 60 $B/moekit ops > "$OUT/ops.txt" 2>&1
grep -E "^  (ref|cpu|cuda) " "$OUT/ops.txt" | tee -a "$S"

if has tests; then
  timeout ${TESTS_LIMIT:-280} $B/moekit_tests --gtest_brief=1 > "$OUT/tests.log" 2>&1
  say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/tests.log" | head -40 | tee -a "$S"
fi

if has check; then
  : > "$OUT/check.log"
  for m in mixtral deepseek-v3 llama4 qwen3-moe; do
    timeout 60 $B/moekit check --op all --backend cuda --model "$m" >> "$OUT/check.log" 2>&1
    say "check cuda $m rc=$? $(tail -1 "$OUT/check.log")"
  done
  grep -E " FAIL " "$OUT/check.log" | head -30 | tee -a "$S"
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    filter=$MEMCHECK_FILTER
    [ "$tool" = racecheck ] && filter=$RACECHECK_FILTER
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 $B/moekit_tests --gtest_brief=1 \
      --gtest_filter="$filter" > "$OUT/sanitize_$tool.log" 2>&1
    say "compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
  done
fi

if has bench; then
  # bf16: every CUDA kernel of the variant; fp8 (SCHEMES, default fp8_tensor): the auto kernel only
  # (small_m fp8 at large T takes seconds per call).
  for m in mixtral deepseek-v3 qwen3-moe; do
    timeout ${BENCH_LIMIT:-90} $B/moekit bench --op fused_moe --backend cuda --model "$m" --full --tokens "$TOKENS" \
      --scheme bf16 --iters ${BENCH_ITERS:-30} --json > "$OUT/bench_$m.json" 2> "$OUT/bench_$m.err"
    say "bench $m rc=$?"
    for sc in ${FP8_SCHEMES:-fp8_tensor}; do
      timeout ${BENCH_LIMIT:-90} $B/moekit bench --op fused_moe --backend cuda --model "$m" --full --tokens "$TOKENS" \
        --scheme "$sc" --kernel fused_moe_sm90_fp8_row --iters ${BENCH_ITERS:-30} --json \
        > "$OUT/bench_${m}_$sc.json" 2> "$OUT/bench_${m}_$sc.err"
      say "bench $m $sc rc=$?"
    done
  done
  python3 - "$OUT" <<'PY' | tee -a "$S"
import csv, json, sys, glob, os
out = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    try:
        rows += [dict(r, model=os.path.basename(f)[6:-5].split("_")[0]) for r in json.load(open(f))]
    except Exception as e:
        print(f"{f}: {e}")
keys = ["model", "kernel", "scheme", "tokens", "time_us", "tflops", "gbps", "mem_floor_us",
        "compute_floor_us", "frac_floor", "baseline_us", "vs_baseline", "status"]
with open(os.path.join(out, "bench.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
for r in rows:
    print(" ".join(f"{k}={r.get(k)}" for k in keys))
PY
fi
if has ep; then
  ngpu=$(nvidia-smi -L | wc -l)
  if [ "$ngpu" -lt 2 ]; then
    say "ep: skipped ($ngpu GPU)"
  else
    timeout 300 $B/moekit_tests --gtest_filter='Ep.*' > "$OUT/ep_tests.log" 2>&1
    say "ep tests rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/ep_tests.log" | tr '\n' ' ')"
    for w in 2 4 8; do
      [ "$w" -gt "$ngpu" ] && break
      timeout ${EP_BENCH_LIMIT:-200} $B/moekit bench --op fused_moe --ep $w --model deepseek-v3 --full \
        --tokens ${EP_TOKENS:-128,1024,4096} > "$OUT/bench_ep$w.txt" 2>&1
      say "bench ep=$w rc=$?"
      cat "$OUT/bench_ep$w.txt" | tee -a "$S"
      timeout ${EP_BENCH_LIMIT:-200} $B/moekit bench --op fused_moe --ep $w --fp8-dispatch --model deepseek-v3 --full \
        --tokens ${EP_TOKENS:-128,1024,4096} > "$OUT/bench_ep${w}_fp8.txt" 2>&1
      say "bench ep=$w fp8-dispatch rc=$?"
      cat "$OUT/bench_ep${w}_fp8.txt" | tee -a "$S"
    done
  fi
fi
say "# done $(date -u +%FT%TZ)"
