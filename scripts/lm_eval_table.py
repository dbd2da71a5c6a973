"""The lm-eval accuracy table of the bundled models: lm-eval's HF backend (model "hf-moekit", see
python/moekit/lmeval.py) on the task eval/lm_eval/moekit_arith.yaml, for every model and experts
implementation, on one backend. Each run prints lm-eval's own table; a summary follows.

    python scripts/lm_eval_table.py --device cpu            # the CPU table (run from anywhere)
    python scripts/lm_eval_table.py --device cuda --json out/lm_eval_cuda.json
    python scripts/lm_eval_table.py --device cpu --limit 16 --models mixtral-tiny   # a quick check

Experts implementations (--schemes): "transformers" (the model's default: transformers' own
grouped_mm experts; the baseline), "moekit" (bf16 experts), "moekit_fp8_tensor",
"moekit_fp8_channel", "moekit_fp8_block" (fp8 W8A8, quantized from the bf16 checkpoint at the first
call). The model runs in --dtype (default bfloat16). One Python process runs them all
(lm_eval.simple_evaluate), so torch and lm-eval are imported once. Docs: docs/models.md ("lm-eval").
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("mixtral-tiny", "deepseek-v3-tiny", "llama4-tiny")
SCHEMES = ("transformers", "moekit", "moekit_fp8_tensor", "moekit_fp8_channel", "moekit_fp8_block")
TASK = "moekit_arith"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (lm-eval's --device)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated folders of models/")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {', '.join(SCHEMES)}")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None, help="problems per run (default: all 500)")
    ap.add_argument("--json", default=None, help="also write the summary rows here")
    args = ap.parse_args(argv)
    schemes = args.schemes.split(",")
    for s in schemes:
        if s not in SCHEMES:
            ap.error(f"--schemes: unknown '{s}' (have {', '.join(SCHEMES)})")
    os.chdir(ROOT)  # the task's data_files path is relative to the repository root
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    import torch
    import transformers
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    from moekit import lmeval

    lmeval.register()
    tm = TaskManager(include_path=os.path.join(ROOT, "eval", "lm_eval"))
    rows = []
    for model in args.models.split(","):
        for scheme in schemes:
            margs = f"pretrained={os.path.join('models', model)},dtype={args.dtype}"
            if scheme != "transformers":
                margs += f",experts_implementation={scheme}"
            print(f"== {model} / {scheme} / {args.device}: lm-eval --model {lmeval.MODEL_NAME} --model_args {margs}",
                  flush=True)
            t0 = time.time()
            res = lm_eval.simple_evaluate(model=lmeval.MODEL_NAME, model_args=margs, tasks=[TASK], device=args.device,
                                          batch_size=args.batch_size, limit=args.limit, task_manager=tm,
                                          log_samples=False)
            print(make_table(res), flush=True)
            r = res["results"][TASK]
            rows.append({"model": model, "backend": args.device, "experts": scheme, "dtype": args.dtype,
                         "exact_match": r["exact_match,strict-match"], "stderr": r["exact_match_stderr,strict-match"],
                         "n": res["n-samples"][TASK]["effective"], "seconds": round(time.time() - t0, 1)})
    base = {r["model"]: r["exact_match"] for r in rows if r["experts"] == "transformers"}
    print(f"\nlm-eval {lm_eval.__version__ if hasattr(lm_eval, '__version__') else ''}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}, device {args.device}, dtype {args.dtype}"
          f"{f', limit {args.limit}' if args.limit else ''}")
    print("| model | backend | experts | exact_match | stderr | vs transformers | n | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = f"{100 * (r['exact_match'] - base[r['model']]):+.1f} pt" if r["model"] in base else ""
        print(f"| {r['model']} | {r['backend']} | {r['experts']} | {r['exact_match']:.4f} | {r['stderr']:.4f} | {d} "
              f"| {r['n']} | {r['seconds']} |")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
