#!/usr/bin/env python3
"""docs/PERF.md's main table from a bench run: one row per (scheme, model), one column per token
count, each cell "moekit us (fraction of the floor) [peer us]", and the unfused cuBLAS baseline's
time over moekit's at T = 1 / 512 / 4096 (bold below 1: cuBLAS faster).

    python3 scripts/perf_table.py out/bench.csv                  # after STEPS=bench scripts/gpu_run.sh
    python3 scripts/perf_table.py bench.csv --peer docs/data/peer_vllm_triton.csv --kernels auto

bench.csv: what scripts/gpu_run.sh's bench step writes (columns model, kernel, scheme, tokens,
time_us, frac_floor, vs_baseline, status, ...). The peer's times (vLLM's Triton fused_moe,
../shared/ANCHORS.md) come from a CSV of model, scheme, tokens, peer_us. Only the auto kernels'
rows are used (fused_moe_sm90_bf16, _fp8_row, _fp8_block) unless --kernels names others. A cell
with no measurement prints "-". Test: tests/check_perf_table.py (ctest perf_table).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

MODELS = (("mixtral", "Mixtral"), ("deepseek-v3", "DeepSeek-V3"), ("qwen3-moe", "Qwen3-30B"))
SCHEMES = ("bf16", "fp8_tensor", "fp8_channel", "fp8_block")
TOKENS = (1, 8, 64, 512, 4096)
AUTO = {"bf16": "fused_moe_sm90_bf16", "fp8_tensor": "fused_moe_sm90_fp8_row",
        "fp8_channel": "fused_moe_sm90_fp8_row", "fp8_block": "fused_moe_sm90_fp8_block"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "", "None", "nan") else None
    except ValueError:
        return None


def load_bench(path: str, kernels: set[str] | None) -> dict:
    """{(model, scheme, tokens): row} of the rows that ran (status ok or empty)."""
    cells = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            scheme = r.get("scheme", "")
            wanted = kernels if kernels is not None else {AUTO.get(scheme)}
            if r.get("kernel") not in wanted or r.get("status", "ok") not in ("", "ok"):
                continue
            try:
                key = (r["model"], scheme, int(r["tokens"]))
            except (KeyError, ValueError):
                continue
            cells[key] = r
    return cells


def load_peer(path: str | None) -> dict:
    if not path:
        return {}
    with open(path, newline="") as fh:
        return {(r["model"], r["scheme"], int(r["tokens"])): float(r["peer_us"]) for r in csv.DictReader(fh)}


def table(cells: dict, peer: dict) -> str:
    lines = ["| model | scheme | " + " | ".join(f"T={t}" for t in TOKENS) + " | vs cuBLAS, T=1 / 512 / 4096 |",
             "|---|---|" + "---|" * len(TOKENS) + "---|"]
    for scheme in SCHEMES:
        for model, label in MODELS:
            row = []
            for t in TOKENS:
                r = cells.get((model, scheme, t))
                us = _float(r.get("time_us")) if r else None
                if us is None:
                    row.append("-")
                    continue
                frac = _float(r.get("frac_floor"))
                cell = f"{us:.1f}" + (f" ({frac:.3f})" if frac is not None else "")
                if (model, scheme, t) in peer:
                    cell += f" [{peer[(model, scheme, t)]:g}]"
                row.append(cell)
            ratios = []
            for t in (1, 512, 4096):
                r = cells.get((model, scheme, t))
                v = _float(r.get("vs_baseline")) if r else None
                ratios.append("-" if v is None else (f"**{v:.2f}**" if v < 1 else f"{v:.2f}"))
            if all(c == "-" for c in row):
                continue
            lines.append(f"| {label} | {scheme} | " + " | ".join(row) + " | " + " / ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_csv")
    ap.add_argument("--peer", default=os.path.join(ROOT, "docs", "data", "peer_vllm_triton.csv"),
                    help="model,scheme,tokens,peer_us (default: docs/data/peer_vllm_triton.csv); '' for none")
    ap.add_argument("--kernels", default="auto", help="'auto' (the auto kernels) or comma-separated kernel names")
    args = ap.parse_args(argv)
    kernels = None if args.kernels == "auto" else set(args.kernels.split(","))
    cells = load_bench(args.bench_csv, kernels)
    if not cells:
        print(f"perf_table: no usable rows in {args.bench_csv} (kernels: {args.kernels})", file=sys.stderr)
        return 1
    sys.stdout.write(table(cells, load_peer(args.peer)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
