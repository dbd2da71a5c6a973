#!/usr/bin/env bash
# The main job: builds moekit, checks every operator of every backend available here against
# the reference / oracle on all model presets, then a short CPU benchmark of the fused MoE (the
# AVX-512 kernel next to the reference it replaces).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
B=${BUILD_DIR:-build}
"$B/moekit" ops
"$B/moekit" check --op all --backend all
"$B/moekit" bench --op fused_moe --backend all --model qwen3-moe --tokens 1,8,32 --scheme bf16 --compare ref
