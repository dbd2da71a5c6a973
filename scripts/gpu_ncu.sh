#!/usr/bin/env bash
# Nsight Compute profile of one `moekit bench` problem on the GPU machine, from the repository root,
# with the staged binary of scripts/gpu_build.sh: the first COUNT launches of the kernels whose names
# match KERNELS, with the sections that say what limits a kernel (speed of light: DRAM / SM
# throughput; compute workload: pipe utilisation; warp state: why warps stall; memory workload;
# instruction statistics). Writes ncu.csv (ncu's raw page: every collected metric of every launch, one
# row each) and ncu.txt (per launch: time, DRAM GB/s and % of peak, SM %, issue %, the four busiest
# pipes and the five largest stall reasons in cycles per issued instruction) to $OUT (default out/).
#   ARGS="--model mixtral --scheme fp8_tensor --tokens 1 --kernel fused_moe_sm90_fp8_row" (required)
#   KERNELS='gemm|quant_groups|reduce|route|gate_up|down|combine' (regex; the bench's own weight
#   quantizer, act_quant, runs once per expert chunk before the timed runs: leave it out)
#   COUNT=8 (launches profiled)  SKIP=0 (matching launches skipped first)  GPU_DIR=.gpu
#   CLOCKS=base|none   METRICS=name,... (added to the sections; a name ncu does not know fails the run)
#   SOURCE=1: also the SourceCounters section (PC sampling per SASS instruction); writes
#   ncu_source.csv (ncu's source page) and ncu_source.txt (scripts/ncu_source.py: samples by stall
#   reason, by opcode, the top instructions; RANGES="lo:hi,..." sums instruction offset ranges).
#   Keep COUNT small: sampling every launch is slow.
# NOTE: ncu replays each launch several times (one pass per metric group) with the L2 flushed in
# between, so its durations are base-clock (CLOCKS=base, ncu's default) single-launch times, longer
# than `moekit bench`'s CUDA-graph medians; compare kernels within one profile, not across tools.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
B=${GPU_DIR:-.gpu}
mkdir -p "$OUT"
for f in "$B"/*.xz; do [ -e "$f" ] && unxz -f -T0 "$f"; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# With SOURCE=1 the profile goes to a report first; the raw and source pages are read from it.
REP=$(mktemp -d /tmp/moekit_ncu.XXXXXX)/ncu
if [ "${SOURCE:-0}" = 1 ]; then out_args=(-o "$REP" --section SourceCounters); else out_args=(--csv --page raw); fi
# shellcheck disable=SC2086
timeout "${LIMIT:-300}" ncu --clock-control "${CLOCKS:-base}" \
  --kernel-name "regex:${KERNELS:-gemm|quant_groups|reduce|route|gate_up|down|combine}" \
  --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-8}" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section InstructionStats ${METRICS:+--metrics "$METRICS"} "${out_args[@]}" \
  "$B/moekit" bench --op fused_moe --backend cuda --full ${ARGS:?ARGS is empty} --iters 1 --warmup 0 \
  > "$OUT/ncu.$([ "${SOURCE:-0}" = 1 ] && echo log || echo csv)" 2> "$OUT/ncu.err"
echo "ncu rc=$?"
if [ "${SOURCE:-0}" = 1 ]; then
  ncu -i "$REP.ncu-rep" --csv --page raw > "$OUT/ncu.csv" 2>> "$OUT/ncu.err"
  ncu -i "$REP.ncu-rep" --csv --page source --print-source sass > "$OUT/ncu_source.csv" 2>> "$OUT/ncu.err"
  python3 scripts/ncu_source.py "$OUT/ncu_source.csv" ${RANGES:+--ranges "$RANGES"} > "$OUT/ncu_source.txt"
  echo "source page rc=$? (ncu_source.txt)"
fi
python3 scripts/ncu_table.py "$OUT/ncu.csv" | tee "$OUT/ncu.txt"
