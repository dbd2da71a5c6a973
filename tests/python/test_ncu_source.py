"""scripts/ncu_source.py (the per-instruction stall summary of scripts/gpu_ncu.sh SOURCE=1) on a small
source page in the format `ncu --page source --csv --print-source sass` writes: a "Kernel Name" line,
a header, one row per SASS instruction. Checks the shares by reason and opcode, the offsets from
the kernel's first instruction, the ranges, two kernels in one file, and the error on a page
without samples.
Run: python -m pytest tests/python/test_ncu_source.py
"""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_source.py"

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_wait", "stall_selected", "stall_barrier (Not Issued)"]


def page(kernel, rows):
    lines = [f'"Kernel Name","{kernel}",', '"' + '","'.join(HEADER) + '"']
    lines += ['"' + '","'.join(r) + '"' for r in rows]
    return "\n".join(lines) + "\n"


ROWS = [["0x7f0000001000", "      QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR20], RZ, !UPT", "10", "9", "1,000", "0", "8", "2", "0"],
        ["0x7f0000001010", "      WARPGROUP.DEPBAR.LE gsb0, 0x0", "60", "60", "1,000", "60", "0", "0", "60"],
        ["0x7f0000001020", "@!P2  FFMA R1, R2, R3, R1", "30", "20", "1,000", "0", "10", "20", "0"]]


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_one_kernel(tmp_path):
    f = tmp_path / "src.csv"
    f.write_text("==PROF== noise\n" + page("void gemm1_blk_kernel<1>(int)", ROWS))
    r = run(f, "--top", "2", "--ranges", "0x0:0x10,0x10:0x30")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "== void gemm1_blk_kernel<1>(int)" in out
    assert "samples 100 | by reason: barrier 60.0%, selected 22.0%, wait 18.0%" in out
    assert "by opcode: WARPGROUP 60.0%, FFMA 30.0%, QGMMA 10.0%" in out  # the predicate is skipped
    assert "range 0x0:0x10 10.0%" in out and "range 0x10:0x30 90.0%" in out
    top = [l for l in out.splitlines() if l.strip().startswith("0x")]
    assert len(top) == 2
    assert top[0].split()[:3] == ["0x10", "60.0%", "1000"]
    assert top[1].split()[:3] == ["0x20", "30.0%", "1000"] and "selected:20.0%" in top[1]


def test_two_kernels(tmp_path):
    f = tmp_path / "src.csv"
    f.write_text(page("k1", ROWS) + page("k2", ROWS[:1]))
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert "== k1" in r.stdout and "== k2" in r.stdout
    assert "samples 10 | by reason: wait 80.0%, selected 20.0%" in r.stdout


def test_page_without_samples(tmp_path):
    f = tmp_path / "raw.csv"
    f.write_text('"ID","Kernel Name"\n"0","k"\n')
    r = run(f)
    assert r.returncode != 0
    assert "SourceCounters" in r.stderr
