#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page
(`ncu -i REPORT --page source --csv --print-source sass` of a report collected with
`--section SourceCounters`; scripts/gpu_ncu.sh with SOURCE=1). Prints, per kernel in the file: the
warp samples by stall reason and by opcode (share of all samples), the share of the address ranges
given with --ranges, and the top instructions with their executions and largest reasons. Addresses
are offsets from the kernel's first instruction, as `cuobjdump -sass` prints them (scripts/sass.sh).
Usage: ncu_source.py SOURCE.csv [--top N] [--ranges 0x1780:0x2870,0x2870:0x17560]"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def kernels_of(path):
    """[(kernel name, header, rows)]: one block per "Kernel Name" line of the page."""
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    out = []
    for r in rows:
        if r and r[0] == "Kernel Name":
            out.append([r[1] if len(r) > 1 else "?", None, []])
        elif out and out[-1][1] is None:
            out[-1][1] = r
        elif out:
            out[-1][2].append(r)
    if not out or any(h is None or SAMPLES not in h for _, h, _ in out):
        sys.exit(f"{path}: no source page with '{SAMPLES}' (collect with --section SourceCounters)")
    return out


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def report(name, head, rows, top, ranges):
    ia, ie, isrc, iaddr = head.index(SAMPLES), head.index(EXECUTED), head.index("Source"), head.index("Address")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r[ia]) for r in rows)
    print(f"== {name}")
    if total == 0:
        print("no samples")
        return
    base = int(rows[0][iaddr], 16)
    pct = lambda x: f"{100.0 * x / total:.1f}%"
    by_reason = sorted(((sum(num(r[i]) for r in rows), lab) for i, lab in reasons), reverse=True)
    print("samples", int(total), "| by reason:", ", ".join(f"{lab} {pct(x)}" for x, lab in by_reason if x >= 0.005 * total))
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode(r[isrc])] += num(r[ia])
    print("by opcode:", ", ".join(f"{op} {pct(x)}" for op, x in by_op.most_common(12)))
    for lo, hi in ranges:
        x = sum(num(r[ia]) for r in rows if lo <= int(r[iaddr], 16) - base < hi)
        print(f"range {lo:#x}:{hi:#x} {pct(x)}")
    print(f"{'offset':>8} {'samples':>8} {'executed':>11}  instruction / largest reasons")
    for r in sorted(rows, key=lambda r: -num(r[ia]))[:top]:
        big = sorted(((num(r[i]), lab) for i, lab in reasons), reverse=True)[:3]
        why = " ".join(f"{lab}:{pct(x)}" for x, lab in big if x > 0)
        print(f"{int(r[iaddr], 16) - base:>#8x} {pct(num(r[ia])):>8} {int(num(r[ie])):>11}  {r[isrc].strip()[:60]:60} {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ranges", default="", help="offset ranges lo:hi, comma-separated (hex or decimal)")
    a = ap.parse_args()
    ranges = []
    for part in filter(None, a.ranges.split(",")):
        lo, hi = part.split(":")
        ranges.append((int(lo, 0), int(hi, 0)))
    for name, head, rows in kernels_of(a.csv):
        report(name, head, rows, a.top, ranges)


if __name__ == "__main__":
    main()
