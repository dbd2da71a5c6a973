"""scripts/ncu_table.py (the table of scripts/gpu_ncu.sh) on a small Nsight Compute raw-page CSV in the
format ncu 2025.x writes: a header row of metric names, a units row, one row per launch. Checks the
unit conversions (ns -> us, byte/s -> GB/s), the kernel-name shortening, the busiest pipes and the
largest stall reasons, '-' for metrics ncu did not collect, and the error on a CSV without rows.
Run: python -m pytest tests/python/test_ncu_table.py
"""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_table.py"

HEADER = ["ID", "Process ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes.sum.per_second",
          "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__inst_issued.avg.pct_of_peak_sustained_elapsed",
          "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
          "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]
UNITS = ["", "", "", "ns", "byte/s", "%", "%", "%", "%", "%", "%", "%", "inst", "inst"]


def write_csv(path, rows):
    lines = ['"' + '","'.join(r) + '"' for r in rows]
    path.write_text("==PROF== noise line\n" + "\n".join(lines) + "\n")


def run(path):
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)


def test_one_launch(tmp_path):
    csv = tmp_path / "ncu.csv"
    row = ["0", "123", "void moekit::cuda::grouped::(anonymous namespace)::gemm1_blk_kernel<1, 0, 64>(CUtensorMap_st)",
           "2,535,552", "941,069,412,893.13", "19.6", "60.7", "55.0", "39.2", "55.7", "20.2", "18.3", "1.23", "1.32"]
    write_csv(csv, [HEADER, UNITS, row])
    r = run(csv)
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[1]
    assert "grouped::gemm1_blk_kernel<1, 0, 64>" in line and "anonymous" not in line
    assert "2535.6" in line  # ns -> us
    assert " 941 " in line   # byte/s -> GB/s
    assert "tensor=55.7" in line and "alu=20.2 fma=18.3" in line
    assert line.index("wait=1.32") < line.index("long_scoreboard=1.23")  # largest stall first


def test_missing_metrics_print_dash(tmp_path):
    csv = tmp_path / "ncu.csv"
    write_csv(csv, [HEADER[:4], UNITS[:4], ["0", "1", "reduce_kernel", "49,440"]])
    r = run(csv)
    assert r.returncode == 0, r.stderr
    fields = r.stdout.splitlines()[1].split()
    assert "49.4" in fields and fields.count("-") == 5


def test_no_rows_is_an_error(tmp_path):
    csv = tmp_path / "ncu.csv"
    csv.write_text("==PROF== no kernels were profiled\n")
    r = run(csv)
    assert r.returncode != 0 and "no ncu rows" in r.stderr
