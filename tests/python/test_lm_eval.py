"""lm-eval (PyPI, its HF backend) on the bundled models with moekit's experts: the documented
commands -- `python -m moekit.lmeval ...` and scripts/lm_eval_table.py -- run on a small --limit,
print lm-eval's own table, run every MoE layer through moekit (Llama-4's by the block swap), and
agree with transformers' own experts. The full table (500 problems) is in docs/models.md.
Each run is a fresh process (as a user runs it; torch's OpenMP pool does not survive a fork).
Skipped where lm_eval is not installed (scripts/test_python.sh installs it)."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ENV = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def run(args, timeout=900):
    p = subprocess.run([sys.executable] + args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def test_lmeval_module_runs_lm_evals_cli(tmp_path):
    # The one-model command of the docs, with an fp8 scheme: lm-eval's CLI, its table, moekit experts.
    out = run(["-m", "moekit.lmeval", "--model", "hf-moekit", "--include_path", "eval/lm_eval",
               "--tasks", "moekit_arith", "--device", DEVICE, "--batch_size", "8", "--limit", "4",
               "--model_args", "pretrained=models/deepseek-v3-tiny,experts_implementation=moekit_fp8_channel,"
               "dtype=bfloat16", "--output_path", str(tmp_path)])
    assert "'experts_implementation=moekit_fp8_channel': 4" in out, out[-2000:]
    assert "|moekit_arith|" in out and "exact_match" in out
    results = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.startswith("results")]
    assert len(results) == 1, results
    with open(results[0]) as f:
        r = json.load(f)["results"]["moekit_arith"]
    assert r["exact_match,strict-match"] >= 0.75


def test_table_script_matches_transformers_on_a_small_limit(tmp_path):
    limit = 12
    js = tmp_path / "rows.json"
    out = run([os.path.join("scripts", "lm_eval_table.py"), "--device", DEVICE, "--limit", str(limit),
               "--models", "mixtral-tiny,llama4-tiny", "--schemes", "transformers,moekit,moekit_fp8_block",
               "--batch-size", "12", "--json", str(js)])
    # Every MoE layer ran where the scheme says: Llama-4's blocks swapped, Mixtral's through the interface.
    assert "models/llama4-tiny: MoE layers {'moekit.MoELayer (quant=None)': 3}" in out
    assert "models/llama4-tiny: MoE layers {'moekit.MoELayer (quant=fp8_block)': 3}" in out
    assert "models/llama4-tiny: MoE layers {'Llama4TextMoe (transformers)': 3}" in out
    assert "models/mixtral-tiny: MoE layers {'experts_implementation=moekit': 4}" in out
    assert out.count("|moekit_arith|") == 6  # lm-eval's own table, once per run
    rows = json.loads(js.read_text())
    assert [(r["model"], r["experts"]) for r in rows] == [
        (m, s) for m in ("mixtral-tiny", "llama4-tiny") for s in ("transformers", "moekit", "moekit_fp8_block")]
    base = {r["model"]: r["exact_match"] for r in rows if r["experts"] == "transformers"}
    for r in rows:
        assert r["n"] == limit
        # The trained models solve these; moekit within one problem of transformers on the same ones.
        assert r["exact_match"] >= 0.75, r
        assert abs(r["exact_match"] - base[r["model"]]) <= 1.0 / limit + 1e-9, r
