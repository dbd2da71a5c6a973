"""scripts/peers_table.py (docs/PERF.md's peers table from scripts/gpu_peers.sh's moekit.csv and
peers.csv) on small hand-written CSVs: the columns per scheme, the cuBLAS baseline column only when
some row has it, '-' for missing, skipped and failed cells, moekit's ratio to the fastest other
column, the reasons and the largest rel_err under the table, and the run as a script.
Run: python -m pytest tests/python/test_peers_table.py
"""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "peers_table.py"

MOEKIT_HEAD = "case,scheme,tokens,kernel,time_us,frac_floor,status,reason,baseline_us,vs_baseline,baseline_reason"
PEERS_HEAD = "peer,scheme,model,tokens,E,k,H,I,time_us,status,reason,rel_err,graph,jit_s"


def write(path, head, rows):
    path.write_text("\n".join([head] + rows) + "\n")
    return path


def run(tmp_path, moekit_rows, peer_rows, moekit_head=MOEKIT_HEAD):
    m = write(tmp_path / "moekit.csv", moekit_head, moekit_rows)
    p = write(tmp_path / "peers.csv", PEERS_HEAD, peer_rows)
    r = subprocess.run([sys.executable, str(SCRIPT), "--moekit", str(m), "--peers", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def cells(out):
    """{(model, T): {column title: cell}} of the table in out."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        row = [c.strip() for c in line.strip("|").split("|")]
        table[(row[0], int(row[1]))] = dict(zip(head, row))
    return table


MOEKIT = [
    "mixtral,bf16,1,fused_moe_sm90_bf16,190.0,0.8,ok,,250.0,1.316,",
    "mixtral,fp8_channel,1,fused_moe_sm90_fp8_row,120.0,0.7,ok,,130.0,1.083,",
    "mixtral,fp8_block,1,fused_moe_sm90_fp8_block,114.5,0.7,ok,,,,baseline failed",
    "mixtral,bf16,8,fused_moe_sm90_bf16,666.4,0.8,ok,,600.0,0.900,",
    "mixtral,fp8_channel,8,fused_moe_sm90_fp8_row,,,skipped,kernel refuses,,,",
]
PEERS = [
    "torch_grouped_mm,bf16,mixtral,1,8,2,4096,14336,321.6,ok,,3.6e-03,true,",
    "torch_scaled_grouped_mm,fp8_channel,mixtral,1,8,2,4096,14336,257.5,ok,,6.2e-02,true,",
    "deepgemm,fp8_block,mixtral,1,8,2,4096,14336,259.8,ok,,4.2e-02,true,12.5",
    "deepgemm,bf16,mixtral,1,8,2,4096,14336,,skipped,--deepgemm-budget-s 120 spent,,,",
    "deepgemm_gemms,fp8_block,mixtral,1,8,2,4096,14336,100.0,ok,,4.0e-02,true,12.6",
    "deepgemm_gemms,bf16,mixtral,1,8,2,4096,14336,150.0,ok,,3.0e-03,true,9.0",
    "torch_grouped_mm,bf16,mixtral,8,8,2,4096,14336,1111.3,ok,,5.0e-03,true,",
    "deepgemm,bf16,mixtral,8,8,2,4096,14336,,error,RuntimeError: boom,,,",
]


def test_columns_values_and_ratio(tmp_path):
    t = cells(run(tmp_path, MOEKIT, PEERS))
    row = t[("mixtral", 1)]
    assert row["bf16: moekit"] == "190.0" and row["bf16: cuBLAS baseline"] == "250.0"
    assert row["bf16: torch._grouped_mm MoE"] == "321.6" and row["bf16: DeepGEMM MoE"] == "-"
    assert row["bf16: DeepGEMM GEMMs only"] == "150.0"
    assert row["bf16: moekit / fastest"] == "1.27 (DG GEMMs)"  # 190 / 150
    assert row["fp8_channel: moekit / fastest"] == "0.92 (cuBLAS)"  # 120 / 130
    assert row["fp8_block: cuBLAS baseline"] == "-"  # the baseline failed in this row only
    assert row["fp8_block: DeepGEMM MoE"] == "259.8" and row["fp8_block: DeepGEMM GEMMs only"] == "100.0"
    assert row["fp8_block: moekit / fastest"] == "1.15 (DG GEMMs)"
    row = t[("mixtral", 8)]
    assert row["bf16: moekit / fastest"] == "1.11 (cuBLAS)"  # 666.4 / 600: the baseline counts
    assert row["fp8_channel: moekit"] == "-" and row["fp8_channel: moekit / fastest"] == "-"
    assert row["fp8_block: moekit"] == "-" and row["fp8_block: DeepGEMM GEMMs only"] == "-"


def test_notes_give_reasons_and_accuracy(tmp_path):
    out = run(tmp_path, MOEKIT, PEERS)
    notes = out.split("\n\n", 1)[1]
    assert "deepgemm bf16 skipped: --deepgemm-budget-s 120 spent (1 cells: mixtral T=1)" in notes
    assert "deepgemm bf16 error: RuntimeError: boom (1 cells: mixtral T=8)" in notes
    assert "moekit fp8_channel skipped: kernel refuses (1 cells: mixtral T=8)" in notes
    assert "cuBLAS baseline fp8_block error: baseline failed (1 cells: mixtral T=1)" in notes
    assert "torch_scaled_grouped_mm fp8_channel: max rel_err 0.062" in notes
    assert "deepgemm_gemms fp8_block: max rel_err 0.04" in notes


def test_no_baseline_column_without_baseline(tmp_path):
    head = "case,scheme,tokens,kernel,time_us,frac_floor,status"  # a --no-baseline run's merged CSV
    out = run(tmp_path, ["mixtral,bf16,1,k,190.0,0.8,ok"], PEERS[:1], moekit_head=head)
    assert "cuBLAS" not in out
    row = cells(out)[("mixtral", 1)]
    assert row["bf16: moekit / fastest"] == "0.59 (torch)"  # 190 / 321.6
    assert row["fp8_block: moekit"] == "-" and row["fp8_block: moekit / fastest"] == "-"


def test_skipped_peer_keeps_its_column_and_empty_rows_drop(tmp_path):
    peers = ["deepgemm,bf16,qwen3-moe,4096,128,8,2048,768,,skipped,import deep_gemm failed: no module,,,"]
    out = run(tmp_path, ["qwen3-moe,bf16,1,k,38.3,0.5,ok,,,,"], peers)
    t = cells(out)
    assert set(t) == {("qwen3-moe", 1)}  # T=4096 has no value anywhere: no row
    assert t[("qwen3-moe", 1)]["bf16: DeepGEMM MoE"] == "-"
    assert t[("qwen3-moe", 1)]["bf16: moekit / fastest"] == "-"
    assert "import deep_gemm failed" in out


def test_missing_files_still_print_a_table(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--moekit", str(tmp_path / "none.csv"),
                        "--peers", str(tmp_path / "none2.csv")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("| model | T |") and "not found" in r.stderr
