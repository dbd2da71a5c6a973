#!/usr/bin/env bash
# Nsight Compute profile of one `moekit bench` problem on the GPU machine, from the repository root,
# with the staged binary of scripts/gpu_build.sh: every launch of the kernels whose names match
# KERNELS, one bench iteration, with the sections that say what limits a kernel (speed of light:
# DRAM / SM throughput; compute workload: the busiest pipes and issue-slot use; warp state: why warps
# stall; memory workload). Writes ncu.csv (every metric of every launch) and ncu.txt (a short table:
# kernel, us, DRAM GB/s, SM and DRAM % of peak, issue %, busiest pipe) to $OUT (default out/).
#   ARGS="--model mixtral --scheme fp8_tensor --tokens 1 --kernel fused_moe_sm90_fp8_row" (required)
#   KERNELS='gemm|quant|reduce|route|gate_up|down|combine' (regex)   GPU_DIR=.gpu   CLOCKS=base|none
#   METRICS=name,... (added to the sections, e.g. sass__inst_executed_per_opcode for the instruction
#   mix, printed per instance; a name ncu does not know fails the whole run)
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
# shellcheck disable=SC2086
timeout "${LIMIT:-300}" ncu --clock-control "${CLOCKS:-base}" --kernel-name "regex:${KERNELS:-gemm|quant|reduce|route|gate_up|down|combine}" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section InstructionStats ${METRICS:+--metrics "$METRICS" --print-metric-instances values} \
  --csv --page details \
  "$B/moekit" bench --op fused_moe --backend cuda --full ${ARGS:?ARGS is empty} --iters 1 --warmup 0 \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"
python3 - "$OUT" <<'PY' | tee "$OUT/ncu.txt"
import csv, os, sys
out = sys.argv[1]
rows = list(csv.reader(l for l in open(os.path.join(out, "ncu.csv")) if l.startswith('"')))
if not rows:
    sys.exit("no ncu rows (see ncu.err)")
head, data = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
launches = {}
for r in data:
    key = (r[col["ID"]], r[col["Kernel Name"]][:60])
    launches.setdefault(key, {})[(r[col["Section Name"]], r[col["Metric Name"]])] = (r[col["Metric Value"]], r[col["Metric Unit"]])
def get(m, name):
    for (sec, n), (v, u) in m.items():
        if n == name:
            return v, u
    return "-", ""
print(f"{'id':>4} {'kernel':60} {'time':>12} {'DRAM tput %':>11} {'SM tput %':>9} {'issue %':>8}  pipes / stalls")
for (i, k), m in launches.items():
    t, tu = get(m, "Duration")
    pipes = [(n, v) for (sec, n), (v, u) in m.items() if sec.startswith("Compute") and "Pipe" in n]
    print(f"{i:>4} {k:60} {t + ' ' + tu:>12} {get(m, 'DRAM Throughput')[0]:>11} {get(m, 'Compute (SM) Throughput')[0]:>9} "
          f"{get(m, 'Issue Slots Busy')[0]:>8}  {' '.join(f'{n}={v}' for n, v in pipes)[:120]}")
PY
