#!/usr/bin/env python3
"""Merges the per-run CSVs of scripts/gpu_run.sh's sweep step (sweep_<name>_<scheme>.csv, written by
`moekit bench --config all --csv`) into one sweep CSV: model (the preset or custom shape's name),
scheme, tokens, E, k, H, I (read from the bench's shape column), config, config_picked, time_us,
status. tests/data/fused_moe_sm90_sweep.csv is such a file; tests/test_fused_moe_sm90_sweep.cpp
reads it.

    python3 scripts/sweep_csv.py DIR OUT.csv
"""
import csv
import glob
import os
import re
import sys

KEYS = ["model", "scheme", "tokens", "E", "k", "H", "I", "config", "config_picked", "time_us", "status"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    rows = []
    for path in sorted(glob.glob(os.path.join(src, "sweep_*_*.csv"))):
        if os.path.abspath(path) == os.path.abspath(out):
            continue
        stem = os.path.basename(path)[len("sweep_"):-len(".csv")]
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                model = stem[:-len(r["scheme"]) - 1]
                # The run's own shape only (a custom shape run without --model custom also times the
                # scaled presets).
                if r.get("case") not in (model, "custom"):
                    continue
                dims = dict(re.findall(r"\b(E|k|H|I)=(\d+)", r.get("shape", "")))
                if len(dims) != 4:
                    print(f"{path}: no E, k, H, I in shape {r.get('shape')!r}", file=sys.stderr)
                    continue
                rows.append(dict(r, model=model, **dims))
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=KEYS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"{out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
