#!/usr/bin/env bash
# A/B timing of builds on the GPU machine, from the repository root: the staged binaries of
# scripts/gpu_build.sh in DIRS (default ".gpu .gpu/b"; the first is the base, A, the others B, C, ...),
# the same `moekit bench` runs for each, alternated ROUNDS times (default 2) so drift of the machine
# shows. Writes NAME.txt and NAME_runs.tgz (the JSON and stderr of every run) to $OUT (default out/;
# two files, so several A/Bs fit in one device call's 8 returned files); prints one line per (model,
# scheme, kernel, tokens): each side's times of every round and its median over A's.
#   RUNS="--model deepseek-v3 --scheme fp8_block --tokens 1,8 --kernel fused_moe_sm90_fp8_block;--model mixtral ..."
#   (runs separated by ';', each the arguments after `moekit bench --op fused_moe --backend cuda --full`)
#   LIMIT=120 (seconds per bench run)  ITERS=30  NAME=ab
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
NAME=${NAME:-ab}
read -r -a dirs <<< "${DIRS:-.gpu .gpu/b}"
sides=(A B C D E F)
mkdir -p "$OUT"
J=$(mktemp -d /tmp/moekit_gpu_ab.XXXXXX)  # the runs' JSON and stderr
trap 'tar -C "$J" -czf "$OUT/${NAME}_runs.tgz" .' EXIT
# scripts/gpu_bundle.sh packs every staged build into one archive: unpack it first.
[ -f .gpu/bundle/bundle.tar.xz ] && tar -C .gpu -xJf .gpu/bundle/bundle.tar.xz
for d in "${dirs[@]}"; do
  for f in "$d"/*.xz; do [ -e "$f" ] && unxz -f -T0 "$f"; done
  [ -x "$d/moekit" ] || { echo "gpu_ab.sh: no $d/moekit (stage it with scripts/gpu_build.sh)"; exit 2; }
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
IFS=';' read -r -a runs <<< "${RUNS:?RUNS is empty}"
for ((r = 0; r < ${ROUNDS:-2}; ++r)); do
  for i in "${!runs[@]}"; do
    for j in "${!dirs[@]}"; do
      side=${sides[$j]} dir=${dirs[$j]}
      # shellcheck disable=SC2086
      timeout "${LIMIT:-120}" "$dir/moekit" bench --op fused_moe --backend cuda --full --iters "${ITERS:-30}" \
        ${runs[$i]} --json > "$J/ab_${side}_${i}_$r.json" 2> "$J/ab_${side}_${i}_$r.err"
      echo "run $i round $r $side rc=$?"
    done
  done
done
python3 - "$J" <<'PY' | tee "$OUT/$NAME.txt"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
times = {}
for f in sorted(glob.glob(os.path.join(out, "ab_*_*_*.json"))):
    side, run, rnd = re.match(r"ab_([A-F])_(\d+)_(\d+)\.json", os.path.basename(f)).groups()
    try:
        rows = json.load(open(f))
    except Exception as e:
        print(f"{f}: {e}")
        continue
    for row in rows:
        key = (row.get("case"), row.get("scheme"), row.get("kernel"), row.get("tokens"))
        times.setdefault(key, {}).setdefault(side, []).append(row.get("time_us"))
fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs) or "-"
for key, t in times.items():
    a = [x for x in t.get("A", []) if x]
    line = [str(k) for k in key] + ["A", fmt(a)]
    for side in sorted(s for s in t if s != "A"):
        b = [x for x in t[side] if x]
        ratio = f"{statistics.median(b) / statistics.median(a):.3f}" if a and b else "-"
        line += [side, fmt(b), f"{side}/A", ratio]
    print(" ".join(line))
PY
