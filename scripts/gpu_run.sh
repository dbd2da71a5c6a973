#!/usr/bin/env bash
# Runs the whole CUDA validation and benchmark on the GPU machine, from the repository root, with
# the binaries staged by scripts/gpu_build.sh in .gpu/. Writes summary.txt and gpu_run_logs.tgz
# (logs, JSON and a CSV) to $OUT (default out/). Each step has its own time limit so a hang cannot eat the run.
#   STEPS="tests check sanitize bench ep" (default; "python" adds the Python package's build + pytest;
#   "sweep" times every fused_moe config of the auto kernels: SWEEP_MODELS, SWEEP_SCHEMES, CSV in
#   sweep.csv, the file tests/data/fused_moe_sm90_sweep.csv records)
#   CHECK_CONFIGS=all (check: also every config of each variant's first CUDA kernel; "" = rules only)
#   BENCH_TOKENS=1,8,64,512,4096   FP8_SCHEMES="fp8_tensor fp8_channel fp8_block" (the default)
#   BENCH_BF16=0|1
#   BENCH_MODELS="mixtral deepseek-v3 qwen3-moe"   BENCH_LIMIT=90 (seconds per bench run)
#   GPU_DIR=.gpu (staged binaries)   TEST_SHARDS=4
#   TEST_FILTER='*' (gtest filter of the tests step)   SANITIZE_TOOLS="memcheck racecheck" (initcheck
#   also; each tool with its own filter, or SANITIZE_FILTER for all of them)
# NOTE: one device call may run 10 minutes. The test binary alone took 4-7 min on the H200 (2026-11-29,
# 509 tests, the machine partly busy; 3.5 min on 2026-12-01 for 532; 4 shards of 564 next to check and
# sanitize ~5.5 min on 2026-12-02), check ~1.5 min, sanitize: memcheck 320 s alone (2026-12-02: it ran
# past a 330 s limit next to the tests; SANITIZE_LIMIT default 420; 2026-12-03, with the decode suite
# added, past 340 s next to 6 test shards: give it its own call), racecheck ~150 s, python (build +
# pytest) ~2 min, bench ~1 min per model for bf16 and 0.3-1.5 min per fp8
# run (one per model and scheme, the auto kernel only; DeepSeek-V3 the longest: its cuBLAS baseline
# plans 256 experts): split them, e.g. STEPS="tests check", then STEPS="sanitize python", then
# STEPS=bench with BENCH_MODELS / FP8_SCHEMES, and STEPS=sweep with SWEEP_MODELS / SWEEP_SCHEMES.
# The ep step (expert parallelism over NCCL) runs on machines with >= 2 GPUs and says so otherwise.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
# The device tool returns at most 8 files from $OUT: every log goes to $L, and on exit $OUT gets
# summary.txt and one archive of all of them (gpu_run_logs.tgz: tests.log, check.log, bench_*.json,
# bench.csv, ...).
L=$(mktemp -d /tmp/moekit_gpu_run.XXXXXX)
trap 'cp "$L/summary.txt" "$OUT/" 2>/dev/null; tar -C "$L" -czf "$OUT/gpu_run_logs.tgz" .' EXIT
B=${GPU_DIR:-.gpu}  # scripts/gpu_build.sh GPU_DIR, e.g. .gpu/b for the other side of an A/B
# scripts/gpu_bundle.sh packs every staged build into one archive: unpack it first.
[ -f .gpu/bundle/bundle.tar.xz ] && tar -C .gpu -xJf .gpu/bundle/bundle.tar.xz
for f in $B/*.xz; do [ -e "$f" ] && unxz -f -T0 "$f"; done  # scripts/gpu_build.sh compresses them
export MOEKIT_TEST_DATA_DIR=$PWD/tests/data MOEKIT_MODELS_DIR=$PWD/models  # tests/test_data_dir.h
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# libnccl: the toolkit's, else the one PyTorch's nvidia-nccl wheel ships.
NCCL_WHEEL=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_WHEEL" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$NCCL_WHEEL
# NVLink multicast stays off on these shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS=${STEPS:-"tests check sanitize bench ep"}
TOKENS=${BENCH_TOKENS:-1,8,64,512,4096}
S="$L/summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
# memcheck: the CUDA tests of the fused kernels and the graph test; racecheck (much slower): small
# shapes of every CUDA kernel that uses shared memory. Both fit the device tool's 10-minute call.
MEMCHECK_FILTER='FusedMoeSm90Grouped*:CudaGraph*:FusedMoeSm90SmallM.Edge*:FusedMoeSm90SmallMFp8.Block*:FusedMoeSm90Fp8BlockAuto*:FusedMoeSm90Decode*:MoeBaselineCublas.Fp8*'
RACECHECK_FILTER='FusedMoeSm90Decode.EdgeCasesAndWeightOnInput:FusedMoeSm90Decode.ExpertsWithMoreThanEightSlots:FusedMoeSm90SmallMFp8.BlockZeroRowsAndLargeValues:FusedMoeSm90SmallMFp8.ZeroRowsAndLargeValues:FusedMoeSm90SmallMFp8.StaticActivationScale:FusedMoeSm90GroupedFp8Block.N256Tiles:FusedMoeSm90GroupedFp8Block.Bm64RowCountsPerExpert:FusedMoeSm90GroupedFp8Block.Bm64FourStagesForLargeK:FusedMoeSm90GroupedFp8Block.Bm64FiveStages:FusedMoeSm90GroupedFp8Block.Tma64RowCounts:FusedMoeSm90GroupedFp8Tma64.RowCountsAndTailTiles:FusedMoeSm90GroupedFp8M192.RowCountsAndTailTiles:FusedMoeSm90GroupedFp8Bm64.ZeroRowsAndLargeValues:FusedMoeSm90Grouped.TOne:FusedMoeSm90Grouped.LongKLoops128RowMTiles:FusedMoeSm90Grouped.WeightOnInput128RowMTiles:FusedMoeSm90Grouped.G1U0:FusedMoeSm90Grouped.ExpertMask:FusedMoeSm90SmallM.BadIds*:SortTokens.CudaHandWorked*:TopkSoftmax.CudaEdge*:GroupedTopk.CudaEdge*:SigmoidTopk.CudaEdge*'

say "# moekit GPU run $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$S"
timeout 60 $B/moekit ops > "$L/ops.txt" 2>&1
grep -E "^  (ref|cpu|cuda) " "$L/ops.txt" | tee -a "$S"

# tests (in TEST_SHARDS gtest shards), check (one process per preset) and sanitize run at the same
# time: they assert no time and are bound by the host's reference code, so the 16 host cores cut
# their wall time from ~8 to ~4 minutes. The bench step runs alone, after them.
bg() {  # bg NAME CMD...: CMD in the background, its exit status in $L/NAME.rc
  local name=$1; shift
  ( "$@"; echo $? > "$L/$name.rc" ) &
}
if has tests; then
  NS=${TEST_SHARDS:-4}
  for ((i = 0; i < NS; ++i)); do
    bg "tests_$i" env GTEST_TOTAL_SHARDS=$NS GTEST_SHARD_INDEX=$i timeout ${TESTS_LIMIT:-420} \
      $B/moekit_tests --gtest_brief=1 --gtest_filter="${TEST_FILTER:-*}" > "$L/tests_$i.log" 2>&1
  done
fi
CHECK_MODELS="mixtral deepseek-v3 llama4 qwen3-moe"
if has check; then
  cc=${CHECK_CONFIGS-all}
  for m in $CHECK_MODELS; do
    bg "check_$m" timeout ${CHECK_LIMIT:-150} $B/moekit check --op all --backend cuda --model "$m" \
      ${cc:+--config "$cc"} > "$L/check_$m.log" 2>&1
  done
fi
if has sanitize; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    filter=$MEMCHECK_FILTER  # memcheck and initcheck
    [ "$tool" = racecheck ] && filter=$RACECHECK_FILTER
    filter=${SANITIZE_FILTER:-$filter}
    bg "sanitize_$tool" timeout ${SANITIZE_LIMIT:-420} compute-sanitizer --tool "$tool" --error-exitcode 99 \
      $B/moekit_tests --gtest_brief=1 --gtest_filter="$filter" > "$L/sanitize_$tool.log" 2>&1
  done
fi
wait
if has tests; then
  for ((i = 0; i < NS; ++i)); do
    say "tests shard $i/$NS rc=$(cat "$L/tests_$i.rc") $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_$i.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]" "$L/tests_$i.log" | head -40 | tee -a "$S"
  done
fi
if has check; then
  for m in $CHECK_MODELS; do
    say "check cuda $m rc=$(cat "$L/check_$m.rc") $(tail -1 "$L/check_$m.log")"
    grep -E " FAIL " "$L/check_$m.log" | head -30 | tee -a "$S"
  done
fi
if has sanitize; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    say "compute-sanitizer $tool rc=$(cat "$L/sanitize_$tool.rc") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/sanitize_$tool.log" | tail -1)"
  done
fi

if has bench; then
  # One run per (model, scheme) of the auto kernel (fused_moe_sm90_bf16 / _fp8_row / _fp8_block), so a
  # run cut by its time limit loses only its own rows. FP8_SCHEMES picks the fp8 schemes (default all
  # three), BENCH_BF16=0 drops bf16, BENCH_MODELS the presets. Every config: STEPS=sweep.
  for m in ${BENCH_MODELS:-mixtral deepseek-v3 qwen3-moe}; do
    schemes=${FP8_SCHEMES:-fp8_tensor fp8_channel fp8_block}
    [ "${BENCH_BF16:-1}" = 1 ] && schemes="bf16 $schemes"
    for sc in $schemes; do
      timeout ${BENCH_LIMIT:-90} $B/moekit bench --op fused_moe --backend cuda --model "$m" --full --tokens "$TOKENS" \
        --scheme "$sc" --iters ${BENCH_ITERS:-30} --json > "$L/bench_${m}_$sc.json" 2> "$L/bench_${m}_$sc.err"
      say "bench $m $sc rc=$?"
    done
  done
  python3 - "$L" <<'PY' | tee -a "$S"
import csv, json, sys, glob, os
out = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    try:
        rows += [dict(r, model=os.path.basename(f)[6:-5].split("_")[0]) for r in json.load(open(f))]
    except Exception as e:
        print(f"{f}: {e}")
keys = ["model", "kernel", "scheme", "tokens", "time_us", "tflops", "gbps", "mem_floor_us",
        "compute_floor_us", "frac_floor", "baseline_us", "vs_baseline", "kernel_chosen", "status"]
with open(os.path.join(out, "bench.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
for r in rows:
    print(" ".join(f"{k}={r.get(k)}" for k in keys))
PY
fi
if has sweep; then
  # Every config the auto kernel can run, per (shape, scheme, T), without the cuBLAS baseline; one CSV
  # per run, then sweep.csv (tests/data/fused_moe_sm90_sweep.csv records one;
  # tests/test_fused_moe_sm90_sweep.cpp reads it). Shapes: the presets of SWEEP_MODELS and the custom
  # SWEEP_SHAPES="name:E,k,H,I ..." (e.g. kimi-k2:384,8,7168,2048).
  sweep_one() {  # sweep_one NAME SCHEME SHAPE-ARGS...
    local name=$1 sc=$2; shift 2
    local k=fused_moe_sm90_bf16
    [ "$sc" != bf16 ] && k=fused_moe_sm90_fp8_row; [ "$sc" = fp8_block ] && k=fused_moe_sm90_fp8_block
    timeout ${SWEEP_LIMIT:-150} $B/moekit bench --op fused_moe --backend cuda "$@" --tokens "$TOKENS" \
      --scheme "$sc" --kernel $k --config all --no-baseline --iters ${SWEEP_ITERS:-20} \
      --csv "$L/sweep_${name}_$sc.csv" > "$L/sweep_${name}_$sc.txt" 2>&1
    say "sweep $name $sc rc=$?"
  }
  for sc in ${SWEEP_SCHEMES:-bf16 fp8_tensor fp8_block}; do
    for m in ${SWEEP_MODELS-mixtral deepseek-v3 qwen3-moe}; do sweep_one "$m" "$sc" --model "$m" --full; done
    for sh in ${SWEEP_SHAPES:-}; do
      IFS=, read -r e k h i <<< "${sh#*:}"
      sweep_one "${sh%%:*}" "$sc" --model custom --experts "$e" --topk "$k" --hidden "$h" --inter "$i"
    done
  done
  python3 scripts/sweep_csv.py "$L" "$L/sweep.csv" | tee -a "$S"
  cp "$L/sweep.csv" "$OUT/" 2>/dev/null
fi
if has python; then
  # The Python package built from this checkout with the image's torch (no network: no build
  # isolation), then pytest, CUDA tests included. The build compiles the CUDA backend (~minutes).
  VENV=none PYTHON=python3 BUILD_ISOLATION=0 timeout ${PYTHON_LIMIT:-540} bash scripts/test_python.sh -q \
    > "$L/python.log" 2>&1
  say "python rc=$? $(grep -E '(passed|failed|error)' "$L/python.log" | tail -1)"
fi
if has ep; then
  ngpu=$(nvidia-smi -L | wc -l)
  if [ "$ngpu" -lt 2 ]; then
    say "ep: skipped ($ngpu GPU)"
  else
    timeout 300 $B/moekit_tests --gtest_filter='Ep.*' > "$L/ep_tests.log" 2>&1
    say "ep tests rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$L/ep_tests.log" | tr '\n' ' ')"
    for w in 2 4 8; do
      [ "$w" -gt "$ngpu" ] && break
      timeout ${EP_BENCH_LIMIT:-200} $B/moekit bench --op fused_moe --ep $w --model deepseek-v3 --full \
        --tokens ${EP_TOKENS:-128,1024,4096} > "$L/bench_ep$w.txt" 2>&1
      say "bench ep=$w rc=$?"
      cat "$L/bench_ep$w.txt" | tee -a "$S"
      timeout ${EP_BENCH_LIMIT:-200} $B/moekit bench --op fused_moe --ep $w --fp8-dispatch --model deepseek-v3 --full \
        --tokens ${EP_TOKENS:-128,1024,4096} > "$L/bench_ep${w}_fp8.txt" 2>&1
      say "bench ep=$w fp8-dispatch rc=$?"
      cat "$L/bench_ep${w}_fp8.txt" | tee -a "$S"
    done
  fi
fi
say "# done $(date -u +%FT%TZ)"
