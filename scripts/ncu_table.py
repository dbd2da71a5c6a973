#!/usr/bin/env python3
"""Short table of an Nsight Compute raw-page CSV (`ncu --csv --page raw`, scripts/gpu_ncu.sh): per
launch the duration, DRAM bandwidth, SM and issue utilisation, the busiest pipes and the largest
warp stall reasons. Columns ncu did not collect print as '-'.
Usage: ncu_table.py ncu.csv"""
import csv
import re
import sys


def rows_of(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if line.startswith('"'))]
    if not rows:
        sys.exit(f"no ncu rows in {path} (see ncu.err)")
    head, data = rows[0], rows[1:]
    units = {}
    if data and data[0][head.index("ID")] == "":  # the raw page's second row: units
        units = dict(zip(head, data[0]))
        data = data[1:]
    return head, units, [dict(zip(head, r)) for r in data]


def num(v):
    try:
        return float(v.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def top(r, pattern, n):
    """The n largest numeric columns whose names match pattern (group 1 = the short label)."""
    found = []
    for k, v in r.items():
        m = re.fullmatch(pattern, k)
        x = num(v)
        if m and x is not None and x > 0:
            found.append((x, m.group(1)))
    found.sort(reverse=True)
    return " ".join(f"{lab}={x:.3g}" for x, lab in found[:n])


def main():
    head, units, data = rows_of(sys.argv[1])

    def get(r, name, scale=1.0, fmt="{:.1f}"):
        x = num(r.get(name))
        return "-" if x is None else fmt.format(x * scale)

    # Units as ncu 2025.x writes them on the raw page ("ns", "byte/s"); the long forms as well.
    t_unit = units.get("gpu__time_duration.sum", "")
    t_scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(t_unit, 1.0)
    bw_unit = units.get("dram__bytes.sum.per_second", "")
    bw_scale = {"byte/s": 1e-9, "Kbyte/s": 1e-6, "Mbyte/s": 1e-3, "Gbyte/s": 1.0, "Tbyte/s": 1e3,
                "byte/second": 1e-9, "Gbyte/second": 1.0, "Tbyte/second": 1e3}.get(bw_unit, 1e-9)
    print(f"{'id':>4} {'kernel':50} {'us':>9} {'DRAM GB/s':>9} {'DRAM%':>6} {'L2%':>6} {'SM%':>6} {'issue%':>6}  "
          "pipes % / stalls (cycles per issue)")
    for r in data:
        name = r.get("Kernel Name", "?")
        name = re.sub(r"^(void )?", "", name)
        name = re.sub(r"moekit::cuda::|\(anonymous namespace\)::|<unnamed>::", "", name)[:50]
        pipes = top(r, r"sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active", 4)
        tensor = top(r, r"sm__pipe_(tensor)_cycles_active\.avg\.pct_of_peak_sustained_active", 1)
        stalls = top(r, r"smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio", 5)
        print(f"{r.get('ID', '?'):>4} {name:50} {get(r, 'gpu__time_duration.sum', t_scale):>9} "
              f"{get(r, 'dram__bytes.sum.per_second', bw_scale, '{:.0f}'):>9} "
              f"{get(r, 'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'):>6} "
              f"{get(r, 'lts__throughput.avg.pct_of_peak_sustained_elapsed'):>6} "
              f"{get(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):>6} "
              f"{get(r, 'sm__inst_issued.avg.pct_of_peak_sustained_elapsed'):>6}  "
              f"{tensor} {pipes} | {stalls}")


if __name__ == "__main__":
    main()
