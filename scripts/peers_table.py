#!/usr/bin/env python3
"""The markdown table of docs/PERF.md's "Peers as whole MoEs" from the two CSVs scripts/gpu_peers.sh
writes: moekit.csv (`moekit bench --csv` rows merged: case, scheme, tokens, time_us, status and, with
BASELINE=1, baseline_us: the unfused cuBLAS baseline) and peers.csv (scripts/bench_peers.py).

One row per model and T; per scheme (bf16, fp8_channel, fp8_block): moekit us, the cuBLAS baseline us
(a column for every scheme once some row has one), each peer of that scheme found in peers.csv
(composed MoEs, DeepGEMM's GEMMs alone), and moekit's time over the fastest of those columns with
that column's short name (< 1: moekit is faster than all of them). '-' where a cell is missing,
skipped or failed; the reasons follow the table, with the largest rel_err of each peer.
Usage: peers_table.py [--moekit moekit.csv] [--peers peers.csv]
Test: tests/python/test_peers_table.py
"""
import argparse
import csv
import sys

SCHEMES = ["bf16", "fp8_channel", "fp8_block"]
# peer -> (column title, short name in the ratio column); peers not listed show under their own name.
LABELS = {
    "torch_grouped_mm": ("torch._grouped_mm MoE", "torch"),
    "torch_scaled_grouped_mm": ("torch._scaled_grouped_mm MoE", "torch"),
    "deepgemm": ("DeepGEMM MoE", "DG MoE"),
    "deepgemm_gemms": ("DeepGEMM GEMMs only", "DG GEMMs"),
}
CUBLAS = ("cuBLAS baseline", "cuBLAS")


def read(path):
    """The rows of a CSV as dicts (an absent file: no rows, and a note on stderr)."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        print(f"# {path}: not found", file=sys.stderr)
        return []


def num(v):
    """A positive float of a CSV cell, or None (empty, 'null', not a number)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x > 0 else None


def collect(moekit_rows, peer_rows):
    """(models, tokens, columns, cells, notes): cells[(model, T, scheme, column)] = us, columns[scheme]
    the ordered (column key, title, short) list, notes the reasons and accuracy lines."""
    models, tokens, cells, reasons, errs = [], set(), {}, {}, {}
    columns = {s: [("moekit", "moekit", "moekit")] for s in SCHEMES}
    has_baseline = False

    def seen(model, T):
        if model not in models:
            models.append(model)
        tokens.add(T)

    for r in moekit_rows:
        model, scheme, T = r.get("case", ""), r.get("scheme", ""), num(r.get("tokens"))
        if scheme not in columns or T is None:
            continue
        seen(model, int(T))
        if r.get("status") != "ok":
            why = f"{r.get('status') or 'missing'}: {r.get('reason') or 'no reason given'}"
            reasons.setdefault(("moekit", scheme, why), []).append(f"{model} T={int(T)}")
            continue
        if r.get("baseline_reason"):
            why = "error: " + r["baseline_reason"]
            reasons.setdefault(("cuBLAS baseline", scheme, why), []).append(f"{model} T={int(T)}")
        for col, value in (("moekit", r.get("time_us")), ("cublas", r.get("baseline_us"))):
            us, key = num(value), (model, int(T), scheme, col)
            if us is not None and (key not in cells or us < cells[key]):
                cells[key] = us
                has_baseline |= col == "cublas"
    for s in SCHEMES:
        if has_baseline:
            columns[s].append(("cublas",) + CUBLAS)
    for r in peer_rows:
        peer, scheme, model, T = r.get("peer", ""), r.get("scheme", ""), r.get("model", ""), num(r.get("tokens"))
        if scheme not in columns or T is None:
            continue
        seen(model, int(T))
        title, short = LABELS.get(peer, (peer, peer))
        if all(c[0] != peer for c in columns[scheme]):
            columns[scheme].append((peer, title, short))
        us = num(r.get("time_us"))
        if r.get("status") == "ok" and us is not None:
            cells[(model, int(T), scheme, peer)] = us
            e = num(r.get("rel_err"))
            if e is not None:
                errs[(peer, scheme)] = max(errs.get((peer, scheme), 0.0), e)
        else:
            why = f"{r.get('status') or 'missing'}: {r.get('reason') or 'no reason given'}"
            reasons.setdefault((peer, scheme, why), []).append(f"{model} T={int(T)}")
    notes = [f"- {peer} {scheme} {why} ({len(where)} cells: {', '.join(where)})"
             for (peer, scheme, why), where in reasons.items()]
    notes += [f"- {peer} {scheme}: max rel_err {e:.2g}" for (peer, scheme), e in errs.items()]
    return models, sorted(tokens), columns, cells, notes


def ratio(cells, key, cols):
    """moekit / the fastest other column of a scheme, with that column's short name; '-' if either is missing."""
    mine = cells.get(key + ("moekit",))
    others = [(cells[key + (c,)], short) for c, _, short in cols if c != "moekit" and key + (c,) in cells]
    if mine is None or not others:
        return "-"
    best, name = min(others)
    return f"{mine / best:.2f} ({name})"


def table(moekit_rows, peer_rows):
    """The markdown table and the notes under it, as one string."""
    models, tokens, columns, cells, notes = collect(moekit_rows, peer_rows)
    head = ["model", "T"]
    for s in SCHEMES:
        head += [f"{s}: {title}" for _, title, _ in columns[s]] + [f"{s}: moekit / fastest"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        for T in tokens:
            row = [model, str(T)]
            for s in SCHEMES:
                for c, _, _ in columns[s]:
                    us = cells.get((model, T, s, c))
                    row.append("-" if us is None else f"{us:.1f}")
                row.append(ratio(cells, (model, T, s), columns[s]))
            if any(v != "-" for v in row[2:]):
                lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("us, median; moekit / fastest: moekit's time over the fastest other column (< 1: moekit faster).")
    if notes:
        lines += ["'-' and accuracy (max |y - ref| / max |ref| against the float32 MoE):"] + notes
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Prints the table of --moekit and --peers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--moekit", default="moekit.csv")
    p.add_argument("--peers", default="peers.csv")
    a = p.parse_args(argv)
    sys.stdout.write(table(read(a.moekit), read(a.peers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
