"""Trains the bundled tiny MoE models on the arithmetic task and writes their checkpoints.

For each model (tools/train/model.py PRESETS: mixtral-tiny, deepseek-v3-tiny, llama4-tiny) this
  1. trains on the train split of tools/train/task.py (loss on the answer tokens only; AdamW, bf16
     autocast on CUDA, warm-up then cosine decay; load balancing: a switch-style auxiliary loss for
     mixtral and llama4, DeepSeek-V3's bias updates for deepseek);
  2. writes models/<name>/{model.safetensors (bf16), config.json, tokenizer.json};
  3. reloads that checkpoint in f32 (bf16 weight values, f32 compute, TF32 off: the reference the
     C++ runner is compared against) and measures exact-match accuracy with greedy decoding on the
     test split and on as many train problems, printing it and writing train_report.json;
  4. writes reference_logits.safetensors: the reference's teacher-forced logits on test problems
     (argmax at every position of the first 200, full f32 logits of the first 2), for the runner's
     logit-agreement check.
Everything is described in docs/models.md. Tests: tools/train/test_train.py.

    python3 tools/train/train.py --model mixtral-tiny   # one model into models/mixtral-tiny (GPU, ~3.5 min)
    python3 tools/train/train.py                        # all three
    python3 tools/train/train.py --smoke                # tiny sizes, a few steps, CPU, < 1 min
"""

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402
import task  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402

N_REF_ARGMAX = 200   # test problems whose per-position argmax goes to reference_logits.safetensors
N_REF_LOGITS = 2     # test problems whose full logits go there
MAX_NEW_TOKENS = 96  # longest completion greedy decoding produces (targets are <= 70 characters)
BIAS_STEP = 1e-3     # DeepSeek-V3's bias update speed
AUX_COEF = 0.01      # weight of the balancing loss


# ---- data ---------------------------------------------------------------------------------------

def encode_split(tok: CharTokenizer, problems: List[Dict], device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, S] uint8 token ids ([bos] prompt target [eos], pad after), lengths [N], prompt lengths [N]
    (bos included: the first label position of the answer)."""
    seqs = [[tok.bos_id] + tok.encode(p["prompt"] + p["target"]) + [tok.eos_id] for p in problems]
    plen = [1 + len(p["prompt"]) for p in problems]
    s = max(len(q) for q in seqs)
    assert len(tok) <= 256, "token ids are stored as uint8"
    buf = bytearray([tok.pad_id]) * (len(seqs) * s)
    for i, q in enumerate(seqs):
        buf[i * s:i * s + len(q)] = bytes(q)
    ids = torch.frombuffer(buf, dtype=torch.uint8).view(len(seqs), s) if buf else torch.zeros(0, s, dtype=torch.uint8)
    return ids.to(device), torch.tensor([len(q) for q in seqs], device=device), torch.tensor(plen, device=device)


def batch_loss(model: M.MoeForCausalLM, ids: torch.Tensor, lens: torch.Tensor, plen: torch.Tensor) -> torch.Tensor:
    s = int(lens.max())
    x = ids[:, :s].long()
    logits = model(x[:, :-1])
    pos = torch.arange(1, s, device=x.device)[None, :]
    mask = (pos >= plen[:, None]) & (pos < lens[:, None])  # predict the answer and the eos only
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    return (loss * mask.reshape(-1)).sum() / mask.sum()


# ---- evaluation ---------------------------------------------------------------------------------

@torch.no_grad()
def greedy(model: M.MoeForCausalLM, tok: CharTokenizer, prompts: List[str], batch: int, max_new: int) -> List[str]:
    """Batched greedy decoding without a cache: every step re-runs the whole (right-padded) batch
    and appends argmax (lowest id on ties) of each row's last logits; a row stops at eos."""
    dev = next(model.parameters()).device
    out: List[str] = []
    for c in range(0, len(prompts), batch):
        enc = [[tok.bos_id] + tok.encode(p) for p in prompts[c:c + batch]]
        n = len(enc)
        buf = torch.full((n, max(map(len, enc)) + max_new), tok.pad_id, dtype=torch.long, device=dev)
        for i, e in enumerate(enc):
            buf[i, :len(e)] = torch.tensor(e, device=dev)
        start = torch.tensor([len(e) for e in enc], device=dev)
        lens = start.clone()
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        rows = torch.arange(n, device=dev)
        for _ in range(max_new):
            logits = model(buf[:, :int(lens.max())])
            nxt = logits[rows, lens - 1].argmax(dim=-1)
            live = ~done
            buf[rows[live], lens[live]] = nxt[live]
            lens = lens + live.long()
            done |= nxt == tok.eos_id
            if bool(done.all()):
                break
        for i in range(n):
            gen = buf[i, int(start[i]):int(lens[i])].tolist()
            out.append(tok.decode([t for t in gen if t != tok.eos_id]))
    return out


def exact_match(model, tok, problems: List[Dict], batch: int) -> Dict:
    completions = greedy(model, tok, [p["prompt"] for p in problems], batch, MAX_NEW_TOKENS)
    hits = [task.extract_answer(c) == p["answer"] for c, p in zip(completions, problems)]
    n, acc = len(hits), sum(hits) / max(1, len(hits))
    # lm-eval's stderr of a mean: sample standard deviation / sqrt(n).
    stderr = math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "exact_match": acc, "stderr": stderr, "examples": [
        {"id": p["id"], "completion": c, "answer": p["answer"], "correct": h}
        for p, c, h in list(zip(problems, completions, hits))[:5]]}


@torch.no_grad()
def reference_logits(model, tok, problems: List[Dict], path: str) -> None:
    ids, lens, _ = encode_split(tok, problems[:N_REF_ARGMAX], next(model.parameters()).device)
    ids = ids.long()
    logits = torch.cat([model(ids[i:i + 50]) for i in range(0, len(ids), 50)])
    pos = torch.arange(ids.shape[1], device=ids.device)[None, :]
    argmax = torch.where(pos < lens[:, None], logits.argmax(dim=-1), torch.full_like(ids, -1))
    M.save_tensors(path, {
        "input_ids": ids.int(), "lengths": lens.int(), "argmax": argmax.int(),
        "logits": logits[:N_REF_LOGITS].float().contiguous()},
        {"format": "pt", "source": "tools/train/train.py", "problems": f"models/data/arith_test.jsonl rows 0..{len(ids) - 1}",
         "compute": "f32 on the bf16 weights of model.safetensors, no KV cache"})


def expert_load(model: M.MoeForCausalLM, ids: torch.Tensor) -> List[List[float]]:
    """Share of routed slots per expert and layer on one batch (after the reference forward)."""
    with torch.no_grad():
        model(ids)
    return [[round(float(v), 4) for v in (b.load.float() / b.load.sum())] for b in model.moe_blocks()]


# ---- training -----------------------------------------------------------------------------------

def train_one(cfg: M.ModelConfig, args, tok: CharTokenizer, data, test: List[Dict], train_eval: List[Dict]) -> Dict:
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = M.MoeForCausalLM(cfg).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), **({"fused": True} if dev.type == "cuda" else {}))
    ids, lens, plen = data
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" else \
        torch.autocast(device_type="cpu", enabled=False)
    print(f"[{cfg.name}] {M.param_count(model) / 1e6:.2f}M parameters, {args.steps} steps of {args.batch}"
          f" (at most {args.minutes} min) on {dev}", flush=True)
    t0, step, losses = time.time(), 0, []
    model.train()
    while True:
        # Progress through the schedule is the larger of steps and time used, so a time-capped run
        # still ends with a decayed learning rate.
        progress = max(step / args.steps, (time.time() - t0) / (60 * args.minutes))
        if progress >= 1:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        pick = torch.randint(0, ids.shape[0], (args.batch,), generator=gen).to(dev)
        with autocast:
            loss = batch_loss(model, ids[pick], lens[pick], plen[pick])
            aux = sum(b.aux_loss for b in model.moe_blocks() if b.aux_loss is not None)
        opt.zero_grad(set_to_none=True)
        (loss + AUX_COEF * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for b in model.moe_blocks():
            b.update_bias(BIAS_STEP)
        losses.append(loss.item())
        step += 1
        if step % args.log_every == 0:
            print(f"[{cfg.name}] step {step} loss {sum(losses[-args.log_every:]) / args.log_every:.4f} lr {lr:.2e}"
                  f" {time.time() - t0:.0f}s", flush=True)
    train_s = time.time() - t0

    out_dir = os.path.join(args.out, cfg.name)
    M.save_model(model.cpu(), out_dir, tok)
    del model, opt
    training = {"steps": step, "batch": args.batch, "lr": args.lr, "seed": args.seed,
                "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])), "train_seconds": round(train_s, 1)}
    return finish(cfg, out_dir, args, tok, test, train_eval, training)


def finish(cfg: M.ModelConfig, out_dir: str, args, tok: CharTokenizer, test: List[Dict], train_eval: List[Dict],
           training: Dict) -> Dict:
    """Steps 3 and 4 on a saved model folder: accuracy of the f32 reference, reference logits and
    train_report.json (`training` holds the training run's numbers)."""
    dev = torch.device(args.device)
    # The reference: the saved bf16 weights, computed in f32 without TF32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = M.load_model(out_dir).to(dev)
    t1 = time.time()
    res_test = exact_match(ref, tok, test, args.eval_batch)
    res_train = exact_match(ref, tok, train_eval, args.eval_batch)
    reference_logits(ref, tok, test, os.path.join(out_dir, "reference_logits.safetensors"))
    load = expert_load(ref, encode_split(tok, test[:64], dev)[0].long())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    report = {
        "model": cfg.name, "family": cfg.family, "architecture": M.ARCHITECTURE[cfg.family], "task": task.TASK_NAME,
        "n_shot": 0, "metric": "exact_match", "test": res_test, "train": res_train,
        "parameters": M.param_count(ref), **training,
        "eval_seconds": round(time.time() - t1, 1), "device": str(dev),
        "torch": torch.__version__, "expert_load_test64": load,
        "reference": "bf16 weights of model.safetensors, f32 compute (TF32 off), greedy decoding, no KV cache, "
                     f"at most {MAX_NEW_TOKENS} new tokens",
    }
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"[{cfg.name}] exact match: test {res_test['exact_match']:.4f} +- {res_test['stderr']:.4f} (n={res_test['n']}),"
          f" train {res_train['exact_match']:.4f} +- {res_train['stderr']:.4f} (n={res_train['n']});"
          f" {training.get('steps')} steps in {training.get('train_seconds')}s -> {out_dir}", flush=True)
    return report


def rewrite_v1(name: str, out_dir: str, tok: CharTokenizer) -> Dict:
    """Rewrites a model folder of the first format (moekit-char tokenizer, moekit_* model types, RoPE
    rotate-half everywhere) as a transformers checkpoint without retraining, where the math allows:
    mixtral-tiny keeps its tensors; llama4-tiny's q_proj / k_proj rows are permuted per head so that
    transformers' interleaved RoPE pairs (2i, 2i+1) hold the old pairs (i, i + d/2) -- the same
    attention scores, exactly. DeepSeek-V3 (MLA) cannot be converted from grouped-query attention:
    retrain it. Returns the training numbers of the old train_report.json."""
    with open(os.path.join(out_dir, "config.json")) as f:
        old = json.load(f)
    if old["model_type"] not in ("mixtral", "moekit_llama4_text"):
        raise SystemExit(f"--rewrite: {out_dir} has model_type {old['model_type']!r}; only mixtral and "
                         "moekit_llama4_text convert (DeepSeek-V3 needs MLA: retrain it)")
    cfg = M.replace(M.PRESETS[name], vocab_size=len(tok))
    state = {k: v.float() for k, v in M.read_safetensors(os.path.join(out_dir, "model.safetensors")).items()}
    if old["model_type"] == "moekit_llama4_text":
        d = cfg.head_dim
        perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=-1).flatten()  # new 2i <- old i
        for k in list(state):
            if k.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
                w = state[k]
                state[k] = w.view(-1, d, w.shape[1])[:, perm].reshape(w.shape)
    model = M.MoeForCausalLM(cfg)
    model.load_state_dict(state, strict=True)
    M.save_model(model, out_dir, tok)
    with open(os.path.join(out_dir, "train_report.json")) as f:
        rep = json.load(f)
    keep = {k: rep[k] for k in ("steps", "batch", "lr", "seed", "final_loss", "train_seconds") if k in rep}
    keep["converted"] = ("from the first format (rotate-half RoPE), q/k rows permuted per head"
                         if old["model_type"] != "mixtral" else "from the first format, tensors unchanged")
    return keep


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description="train the bundled tiny MoE models (docs/models.md)")
    ap.add_argument("--model", default="all", help=f"one of {', '.join(M.PRESETS)} or 'all' (comma-separated list ok)")
    ap.add_argument("--out", default=None, help="output folder (default: models/ of the repository; --smoke: a temp dir)")
    ap.add_argument("--steps", type=int, default=6000, help="training steps per model (or --minutes, whichever first)")
    ap.add_argument("--minutes", type=float, default=3.0, help="training time cap per model")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--train-size", type=int, default=200000, help="distinct training problems")
    ap.add_argument("--eval-n", type=int, default=task.TEST_SIZE, help="test (and train) problems evaluated")
    ap.add_argument("--eval-batch", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--device", default=None, help="default: cuda when available (--smoke: cpu)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and a few steps (a CPU check of the pipeline)")
    ap.add_argument("--rewrite", action="store_true",
                    help="convert the first-format folders in --out instead of training (mixtral, llama4), then evaluate")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = list(M.PRESETS) if args.model == "all" else args.model.split(",")
    for n in names:
        if n not in M.PRESETS:
            ap.error(f"--model: unknown model '{n}' (have {', '.join(M.PRESETS)})")
    if args.smoke:
        import tempfile
        args.out = args.out or os.path.join(tempfile.gettempdir(), "moekit_smoke_models")
        args.steps, args.batch, args.train_size, args.eval_n, args.log_every, args.warmup = 30, 16, 2000, 16, 10, 5
        torch.set_num_threads(min(2, torch.get_num_threads()))
    args.out = args.out or os.path.join(root, "models")
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    tok = CharTokenizer.default()
    t0 = time.time()
    test = task.test_split()
    train = task.train_split(args.train_size, exclude={p["question"] for p in test})
    data = encode_split(tok, train, torch.device(args.device))
    test, train_eval = test[:args.eval_n], train[:args.eval_n]
    print(f"data: {len(train)} train problems, {len(test)} test problems ({time.time() - t0:.1f}s)", flush=True)

    reports = []
    for n in names:
        cfg = M.PRESETS[n]
        cfg = M.smoke_config(cfg) if args.smoke else cfg
        if args.rewrite:
            out_dir = os.path.join(args.out, n)
            reports.append(finish(M.replace(cfg, vocab_size=len(tok)), out_dir, args, tok, test, train_eval,
                                  rewrite_v1(n, out_dir, tok)))
            continue
        reports.append(train_one(M.replace(cfg, vocab_size=len(tok)), args, tok, data, test, train_eval))
    print("\n| model | family | task | n-shot | metric | test | stderr | train |")
    print("|---|---|---|---|---|---|---|---|")
    for r in reports:
        print(f"| {r['model']} | {r['family']} | {r['task']} | {r['n_shot']} | exact_match | {r['test']['exact_match']:.4f}"
              f" | {r['test']['stderr']:.4f} | {r['train']['exact_match']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
