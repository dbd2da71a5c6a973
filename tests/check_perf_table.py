#!/usr/bin/env python3
"""scripts/perf_table.py against docs/PERF.md: the page's main table, turned back into a bench.csv
(its times, floor fractions and cuBLAS ratios), must come out of the generator line for line, with
the peer times of docs/data/peer_vllm_triton.csv. So the page is what the generator makes of a
bench run, and the generator keeps the page's format. Run by ctest (perf_table)."""

import csv
import os
import re
import subprocess
import sys
import tempfile

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from perf_table import AUTO, MODELS, TOKENS  # noqa: E402  (the generator's own models, kernels, columns)

LABELS = {label: model for model, label in MODELS}


def main() -> int:
    page = open(os.path.join(ROOT, "docs", "PERF.md")).read().split("\n")
    start = next(i for i, l in enumerate(page) if l.startswith("| model | scheme | T=1 |"))
    table = page[start:start + 2]
    for line in page[start + 2:]:
        if not line.startswith("| "):
            break
        table.append(line)
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        model, scheme = LABELS[cells[0]], cells[1]
        ratios = [c.replace("*", "") for c in cells[7].split(" / ")]
        for t, cell in zip(TOKENS, cells[2:7]):
            m = re.match(r"([0-9.]+) \(([0-9.]+)\)", cell)
            if not m:
                continue
            ratio = ratios[(1, 512, 4096).index(t)] if t in (1, 512, 4096) else ""
            rows.append({"model": model, "kernel": AUTO[scheme], "scheme": scheme, "tokens": t, "time_us": m.group(1),
                         "frac_floor": m.group(2), "vs_baseline": "" if ratio == "-" else ratio, "status": "ok"})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.csv")
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "perf_table.py"), path],
                             capture_output=True, text=True, check=True).stdout.rstrip("\n").split("\n")
    if out != table:
        for i, (a, b) in enumerate(zip(table, out)):
            if a != b:
                print(f"docs/PERF.md table line {i}:\n  page      {a}\n  generator {b}")
        if len(out) != len(table):
            print(f"docs/PERF.md table: {len(table)} lines, the generator {len(out)}")
        return 1
    print(f"perf_table: the {len(table) - 2} rows of docs/PERF.md's table come out of scripts/perf_table.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
