#!/usr/bin/env python3
"""Times a transformers MoE model's forward pass with each experts implementation (issue 29 item 5).

transformers 5.x runs every MoE layer's experts through the implementation named by
`model.set_experts_implementation(...)`: its own "eager" (a Python loop over the experts hit),
"grouped_mm" (torch grouped GEMM, the default) and "batched_mm" (gathers one expert weight matrix
per (token, expert) pair, then torch.bmm), plus "moekit" (python/moekit/hf.py). This script builds
small random-weight models of transformers' own classes (MixtralForCausalLM, Qwen3MoeForCausalLM,
DeepseekV3ForCausalLM), checks each implementation's logits against eager, and times:

  prefill512   one forward of 512 tokens (batch 1, fresh KV cache, logits of the last token only,
               as generate()'s prefill does)
  decode1      one new token for 1 sequence with a KV cache of --context tokens
  decode32     one new token for each of 32 sequences with a KV cache of --context tokens

Decode: the cache is filled once per (model, batch) by a prefill of --context random tokens; every
timed call appends one token and the cache is cropped back afterwards (outside the timed region),
so each call sees the same state. Everything except the experts implementation is identical
(attention: sdpa; no CUDA graphs, no torch.compile), so differences are the experts' alone.

Implementations are interleaved (one call of each in turn, rotating the order, per repeat) to
spread a shared machine's noise evenly; each cell reports the median and the best call.
CPU: time.perf_counter, torch.set_num_threads(--threads) and MOEKIT_NUM_THREADS=--threads (moekit's
CPU thread pool). CUDA: torch.cuda.Event around each call, after a synchronize. On a CPU with
few cores, torch's OpenMP workers spin-wait after each parallel region and take cores from
moekit's pool, which costs moekit's short (decode) calls; OMP_WAIT_POLICY=PASSIVE in the
environment measures without that (docs/PERF.md has both).

  python scripts/bench_hf.py                                    # CPU, small configs, bf16
  python scripts/bench_hf.py --dtype bf16,f32 --json out.json
  python scripts/bench_hf.py --device cuda --preset h200 --json h200.json

Correctness guard: before timing, each implementation's logits (all 512 prefill tokens, and each
decode batch) are compared with eager's on the same inputs and cache: max |diff| is reported, and
an implementation with more than 10% of its tokens off by over --tol x max |eager logit| (default
5e-2 bf16/f16, 1e-3 f32) is not timed for that model and phase. (Up to 10% are let through: with
random weights a token's top-k choice can flip on a near-tie between any two implementations,
eager and grouped_mm included, and that token is then off by far more than rounding.)
batched_mm is skipped where its gathered weights would exceed --batched-mm-max-gib (the prefill
of every preset: 512 x top-k (token, expert) pairs, each gathering a whole expert's weights).
Docs: docs/PERF.md, "transformers forward: experts implementations (issue 29)".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

IMPLS = ("eager", "grouped_mm", "batched_mm", "moekit")
HF_IMPLS = ("eager", "grouped_mm", "batched_mm")
PHASES = ("prefill512", "decode1", "decode32")
DTYPES = {"bf16": "bfloat16", "f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16"}

# Per-model configs. "small": sized for a CPU run of a few minutes (2 layers, vocab 1024; the same
# active expert FLOPs per token for the three). "h200": real per-layer shapes (few layers, reduced
# vocab); these are the layer shapes of Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3.
PRESETS = {
    "small": {
        "mixtral": dict(vocab_size=1024, hidden_size=1024, intermediate_size=1024, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2),
        "qwen3moe": dict(vocab_size=1024, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                         num_experts=32, num_experts_per_tok=4, norm_topk_prob=True),
        "deepseekv3": dict(vocab_size=1024, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512,
                           num_hidden_layers=2, first_k_dense_replace=0, num_attention_heads=8,
                           num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_rope_head_dim=32,
                           qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=32, n_shared_experts=1,
                           num_experts_per_tok=4, n_group=4, topk_group=2, num_nextn_predict_layers=0),
    },
    "h200": {
        "mixtral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2),
        "qwen3moe": dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         num_experts=128, num_experts_per_tok=8, norm_topk_prob=True),
        "deepseekv3": dict(vocab_size=32000, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                           num_hidden_layers=2, first_k_dense_replace=0, num_attention_heads=128,
                           num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                           qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
                           num_experts_per_tok=8, n_group=8, topk_group=4, num_nextn_predict_layers=0),
    },
}
MODEL_CLASSES = {"mixtral": ("MixtralConfig", "MixtralForCausalLM"),
                 "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
                 "deepseekv3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="bf16", help="comma list of bf16, f32, f16 (default bf16)")
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model sizes (default small)")
    p.add_argument("--models", default="mixtral,qwen3moe", help=f"comma list of {', '.join(MODEL_CLASSES)}")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma list (eager is always run for the check)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma list of prefillN / decodeB")
    p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
    p.add_argument("--context", type=int, default=128, help="KV-cache length of the decode phases (default 128)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per cell for prefill (default 5)")
    p.add_argument("--decode-repeat", type=int, default=0, help="timed calls per cell for decode (default 4x --repeat)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per implementation before timing (default 2)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch and moekit (default: all cores)")
    p.add_argument("--tol", type=float, default=0.0,
                   help="max |logit diff| / max |eager logit| accepted (default 5e-2 bf16/f16, 1e-3 f32)")
    p.add_argument("--batched-mm-max-gib", type=float, default=4.0,
                   help="skip batched_mm where its gathered expert weights would exceed this (default 4 GiB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="write the results and the environment to this file")
    args = p.parse_args(argv)
    args.dtypes = [_dtype_name(d) for d in args.dtype.split(",") if d]
    args.models = [m for m in args.models.split(",") if m]
    args.impls = [i for i in args.impls.split(",") if i]
    args.phases = [ph for ph in args.phases.split(",") if ph]
    for m in args.models:
        if m not in MODEL_CLASSES:
            p.error(f"unknown model {m!r} (known: {', '.join(MODEL_CLASSES)})")
    for i in args.impls:
        if i not in IMPLS:
            p.error(f"unknown implementation {i!r} (known: {', '.join(IMPLS)})")
    for ph in args.phases:
        if not (_phase(ph)):
            p.error(f"bad phase {ph!r}: prefillN or decodeB, e.g. prefill512, decode32")
    if args.threads <= 0:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.decode_repeat <= 0:
        args.decode_repeat = 4 * args.repeat
    return args


def _dtype_name(d: str) -> str:
    if d not in DTYPES:
        raise SystemExit(f"bench_hf.py: unknown dtype {d!r} (bf16, f32, f16)")
    return {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}[DTYPES[d]]


def _phase(name: str):
    """('prefill', tokens) or ('decode', batch), or None."""
    for kind in ("prefill", "decode"):
        if name.startswith(kind) and name[len(kind):].isdigit() and int(name[len(kind):]) > 0:
            return kind, int(name[len(kind):])
    return None


# ------------------------------------------------------------------------------ environment
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mtime(folder: str) -> str:
    """When the package in `folder` was installed (its newest file), to tell builds apart."""
    try:
        newest = max(os.path.getmtime(os.path.join(folder, f)) for f in os.listdir(folder))
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest))
    except (OSError, ValueError):
        return ""


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


# ------------------------------------------------------------------------------ models
def build_model(torch, transformers, name: str, preset: str, dtype, device: str, layers: int, seed: int):
    cfg_cls, model_cls = (getattr(transformers, c) for c in MODEL_CLASSES[name])
    kw = dict(PRESETS[preset][name])
    if layers > 0:
        kw["num_hidden_layers"] = layers
    config = cfg_cls(**kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    return model


def experts_shape(model):
    """(num_experts, top_k, gate_up elements per expert, down elements per expert) of the first MoE layer."""
    for m in model.modules():
        if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj") and getattr(m.gate_up_proj, "dim", lambda: 0)() == 3:
            c = model.config
            k = getattr(c, "num_experts_per_tok", 0)
            return m.gate_up_proj.shape[0], k, m.gate_up_proj[0].numel(), m.down_proj[0].numel()
    raise SystemExit(f"bench_hf.py: {type(model).__name__} has no 3-D experts module")


def set_impl(model, impl: str) -> None:
    model.set_experts_implementation(impl)
    got = model.config._experts_implementation
    if got != impl:
        raise RuntimeError(f"set_experts_implementation({impl!r}) gave {got!r}")


def cache_kwarg(model) -> str:
    """transformers 5.24 renamed forward's past_key_values to cache (the old name warns)."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # a negative count removes that many tokens (old and new transformers alike)


# ------------------------------------------------------------------------------ timing
class Timer:
    def __init__(self, torch, device: str):
        self.torch, self.cuda = torch, device == "cuda"

    def __call__(self, fn) -> float:
        """Milliseconds of one fn() call."""
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    args = parse_args(argv)
    # moekit's CPU pool reads MOEKIT_NUM_THREADS when its first CPU kernel runs: set before import.
    if args.device == "cpu":
        os.environ["MOEKIT_NUM_THREADS"] = str(args.threads)
    import torch
    import transformers
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    elif not torch.cuda.is_available():
        raise SystemExit("bench_hf.py: --device cuda but torch.cuda.is_available() is False")
    moekit = None
    if "moekit" in args.impls:
        import moekit  # registers "moekit" in transformers' ExpertsInterface
        moekit.hf.register()
    timer = Timer(torch, args.device)

    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([os.path.basename(sys.executable), "scripts/bench_hf.py"] + list(sys.argv[1:] if argv is None else argv)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "moekit": getattr(moekit, "__version__", "") if moekit else "",
        "moekit_commit": git_commit(),  # of this checkout; the package measured is moekit_path's
        "moekit_path": os.path.dirname(moekit.__file__) if moekit else "",
        "moekit_installed": _mtime(os.path.dirname(moekit.__file__)) if moekit else "",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": args.threads if args.device == "cpu" else None,
        "cpu_count": os.cpu_count(),
        "preset": args.preset,
        "context": args.context,
        "repeat": args.repeat,
        "decode_repeat": args.decode_repeat,
        "warmup": args.warmup,
        "attention": "sdpa",
        "cuda_graphs": False,
        "loadavg_start": _loadavg(),
    }
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items() if v not in ("", None)), flush=True)

    results, checks = [], []
    t_start = time.perf_counter()
    for dname in args.dtypes:
        dtype = getattr(torch, DTYPES[dname])
        tol = args.tol or (1e-3 if dname == "f32" else 5e-2)
        for mname in args.models:
            t0 = time.perf_counter()
            model = build_model(torch, transformers, mname, args.preset, dtype, args.device, args.layers, args.seed)
            E, k, gu, dn = experts_shape(model)
            c = model.config
            desc = (f"{type(model).__name__} {dname}: layers={c.num_hidden_layers} hidden={c.hidden_size} "
                    f"experts={E} top-{k} moe_intermediate={gu // c.hidden_size // 2} vocab={c.vocab_size}")
            print(f"\n## {mname}: {desc} (built in {time.perf_counter() - t0:.1f} s)", flush=True)
            impls = ["eager"] + [i for i in args.impls if i != "eager"]
            ckw = cache_kwarg(model)
            gen = torch.Generator().manual_seed(args.seed + 1)
            for phase in args.phases:
                kind, n = _phase(phase)
                batch, tokens = (1, n) if kind == "prefill" else (n, 1)
                # batched_mm gathers one [2I, H] and one [H, I] matrix per (token, expert) pair.
                gather_gib = batch * tokens * k * (gu + dn) * dtype.itemsize / 2**30
                ids = torch.randint(0, c.vocab_size, (batch, tokens), generator=gen).to(args.device)
                cache = None
                if kind == "decode":
                    ctx_ids = torch.randint(0, c.vocab_size, (batch, args.context), generator=gen).to(args.device)
                    set_impl(model, "grouped_mm")  # transformers' default; the cache's contents are shared by all
                    cache = transformers.DynamicCache(config=c)
                    with torch.inference_mode():
                        model(ctx_ids, use_cache=True, logits_to_keep=1, **{ckw: cache})

                def call(check: bool = False):
                    with torch.inference_mode():
                        if kind == "prefill":
                            out = model(ids, use_cache=True, logits_to_keep=0 if check else 1,
                                        **{ckw: transformers.DynamicCache(config=c)})
                        else:
                            out = model(ids, use_cache=True, **{ckw: cache})
                    if cache is not None:
                        crop(cache, args.context)
                    return out.logits

                # Correctness guard: every implementation against eager, same inputs and cache.
                ok, ref = [], None
                for impl in impls:
                    if impl == "batched_mm" and gather_gib > args.batched_mm_max_gib:
                        note = f"skipped: would gather {gather_gib:.1f} GiB of expert weights (--batched-mm-max-gib)"
                        checks.append(dict(dtype=dname, model=mname, phase=phase, impl=impl, status="skipped", note=note))
                        print(f"  {phase:10s} {impl:10s} {note}", flush=True)
                        continue
                    set_impl(model, impl)
                    try:
                        logits = call(check=True).float()
                    except Exception as e:  # noqa: BLE001 -- reported, that implementation is not timed
                        note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                        checks.append(dict(dtype=dname, model=mname, phase=phase, impl=impl, status="failed", note=note))
                        print(f"  {phase:10s} {impl:10s} {note}", flush=True)
                        if impl == "eager":
                            break
                        continue
                    if impl == "eager":
                        ref = logits
                        scale = ref.abs().max().item()
                        ok.append(impl)
                        continue
                    err = (logits - ref).abs().reshape(-1, logits.shape[-1]).amax(dim=1)  # per token
                    diff = err.max().item()
                    rel = diff / scale if scale else float("inf")
                    over = int((err > tol * scale).sum())
                    # A token whose top-k choice flipped on a near-tie (rounding differs between any two
                    # implementations, eager included) is off by far more than rounding: up to 10% of the
                    # tokens may be; a broken implementation is off on most.
                    good = bool(torch.isfinite(logits).all()) and over <= err.numel() // 10
                    note = "" if good else f"mismatch: {over}/{err.numel()} tokens off by > {tol:g} x max|logit|"
                    checks.append(dict(dtype=dname, model=mname, phase=phase, impl=impl,
                                       status="ok" if good else "mismatch", max_abs_diff=diff, rel_diff=rel,
                                       tokens_over_tol=over, tokens=err.numel(), max_abs_logit=scale, tol=tol,
                                       note=note))
                    print(f"  {phase:10s} {impl:10s} max|diff| vs eager {diff:.3e} (rel {rel:.2e}, max|logit| "
                          f"{scale:.3e}; {over}/{err.numel()} tokens over tol){'' if good else '  MISMATCH: not timed'}",
                          flush=True)
                    if good:
                        ok.append(impl)
                timed = [i for i in ok if i in args.impls]
                if not timed:
                    continue

                reps = args.repeat if kind == "prefill" else args.decode_repeat
                for impl in timed:
                    set_impl(model, impl)
                    for _ in range(args.warmup):
                        call()
                samples = {i: [] for i in timed}
                for r in range(reps):
                    order = timed[r % len(timed):] + timed[:r % len(timed)]
                    for impl in order:
                        set_impl(model, impl)
                        samples[impl].append(timer(call))
                for impl in timed:
                    s = samples[impl]
                    results.append(dict(dtype=dname, model=mname, phase=phase, impl=impl, batch=batch,
                                        tokens=tokens, context=args.context if kind == "decode" else 0,
                                        median_ms=statistics.median(s), best_ms=min(s), samples_ms=s))
                med = {i: statistics.median(samples[i]) for i in timed}
                print("  " + phase + ": " + ", ".join(f"{i} {med[i]:.2f}" for i in timed) + " ms (median)", flush=True)
                del cache
            del model
            if args.device == "cuda":
                torch.cuda.empty_cache()
    env["wall_s"] = round(time.perf_counter() - t_start, 1)
    env["loadavg_end"] = _loadavg()

    print()
    print(format_table(results, checks))
    print(f"\n# total {env['wall_s']} s; 1/5/15-min load average at start {env['loadavg_start']}, "
          f"at end {env['loadavg_end']} (other processes on a shared machine show here)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, results=results, checks=checks), f, indent=1)
        print(f"# wrote {args.json}")
    return 0


def format_table(results, checks) -> str:
    """Markdown table: one row per (dtype, model, phase, impl); moekit's row carries its speed-up
    over the fastest transformers implementation of that cell (by median)."""
    rows = ["| dtype | model | phase | impl | median ms | best ms | moekit speed-up |",
            "|---|---|---|---|---|---|---|"]
    keys = []
    for r in results + checks:
        key = (r["dtype"], r["model"], r["phase"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        cell = {r["impl"]: r for r in results if (r["dtype"], r["model"], r["phase"]) == key}
        skipped = {c["impl"]: c for c in checks if (c["dtype"], c["model"], c["phase"]) == key
                   and c["status"] != "ok"}
        hf = [(cell[i]["median_ms"], i) for i in HF_IMPLS if i in cell]
        for impl in IMPLS:
            if impl in cell:
                r = cell[impl]
                up = ""
                if impl == "moekit" and hf:
                    best_ms, best_impl = min(hf)
                    up = f"{best_ms / r['median_ms']:.2f}x vs {best_impl}"
                rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {impl} | {r['median_ms']:.2f} | {r['best_ms']:.2f} | {up} |")
            elif impl in skipped:
                rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {impl} | - | - | {skipped[impl]['note']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
