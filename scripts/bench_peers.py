#!/usr/bin/env python3
"""Times whole MoE forward passes built from public PyTorch / DeepGEMM pieces (issue 32, item 4), and
DeepGEMM's two grouped GEMMs alone as a lower bound, on the problems `moekit bench --op fused_moe
--full` times, and writes a CSV to set next to moekit's.

Problems: the presets at full size (g1u1: w1 [E, 2I, H] = gate rows then up rows, w2 [E, H, I],
SiLU(gate) * up), T tokens each; routing is a random top-k per token (seeded; distinct experts,
softmax over the chosen random logits), the same for every peer of a problem. Composed peers, each
timed as one unit from x [T, H] bf16 and the routing to y [T, H] bf16 (sort by expert, gather, two
grouped GEMMs, SiLU * up, weighted combine):
  torch_grouped_mm         bf16         torch._grouped_mm on the expert-sorted rows
  torch_scaled_grouped_mm  fp8_channel  torch._scaled_grouped_mm: e4m3 weights with per-output-row
                                        scales (made once, untimed), activations quantized per row
                                        inside the timed region, before each GEMM
  deepgemm                 fp8_block    deep_gemm.m_grouped_fp8_gemm_nt_contiguous: 1x128 activation
                                        scales (timed), 128x128 weight block scales (untimed)
  deepgemm                 bf16         deep_gemm.m_grouped_bf16_gemm_nt_contiguous
DeepGEMM's contiguous layout pads every expert's rows to its M alignment (128) with m_indices -1.
The padded row count is fixed by the routing, so it is computed once outside the timed region (as
a dispatcher that reports per-expert counts to the host provides it); where each row goes is
computed on the GPU inside it, as for the torch peers.
The GEMM-only lower bound (ANCHORS.md's "DeepGEMM's grouped GEMMs" recipe, on this cell's routing):
  deepgemm_gemms           fp8_block    only the two DeepGEMM grouped GEMM calls are timed: gemm1 on
  deepgemm_gemms           bf16         the expert-sorted padded rows of x (fp8: quantized, 1x128
                                        scales already in DeepGEMM's MN-major TMA-aligned layout),
                                        gemm2 on SiLU * up of gemm1's real output (fp8: quantized),
                                        both inputs prepared once, before the timing
Not timed for it: the routing layout, the gather, every quantization, SiLU * up, the scale relayout
and the combine (all prepared or applied outside the events). Its accuracy: gemm2's output rows,
combined with the routing weights outside the timed region, against the same float32 MoE, so its
rel_err compares with the composed peers'. A peer that is missing or fails is written with status
skipped / error and the reason; the run goes on.

Timing: 3 warm-up calls, then a CUDA-graph capture (eager when capture fails), then --iters calls,
each after a 256 MB write that flushes L2 (outside the events); the median in microseconds.
Accuracy: every cell's output against a float32 torch MoE on the same bf16 inputs and weights.

Budgets (seconds since start; a cell not started is written skipped with the budget as reason):
  --budget-s 400           start no cell after it (the JIT warm-up below included).
  --deepgemm-jobs N        DeepGEMM JIT warm-up processes (default min(12, CPUs - 2); 0: none, every
                           kernel compiles inside the grid on its first call, as before).
  --deepgemm-jit-budget-s 180   the warm-up (scripts/peers_deepgemm.py) starts no compile after it
                           (those running get 45 s more). About 60 jobs: 3 presets x 5 T x 2 schemes
                           x 2 GEMMs, one NVCC compile each (fewer where T's share a config); the
                           2026-12-03 run got through ~13 cells' kernels in 90 s one after another, so
                           12 at a time should need a minute or two: 180 s is margin, not the plan.
                           A cell whose kernels were not warmed is skipped, not compiled in the grid
                           (when no job worked at all, the grid compiles on first calls instead).
  --deepgemm-budget-s 120  DeepGEMM cells' time inside the grid (preparation, warm-up calls with
                           the cached cubins' loads, timing): ~60 cells at well under 1 s each.
  --deepgemm-jit-mem-gb 80 GPU memory the warm-up jobs' scratch tensors may hold at once.
Per cell, jit_s is the NVCC / cache seconds of the warm-up jobs of its two GEMMs plus its first call.

  PYTHONPATH=/path/to/vllm/third_party python3 scripts/bench_peers.py --out peers.csv
  python3 scripts/bench_peers.py --models qwen3-moe --tokens 64 --schemes bf16 --iters 5

CSV columns: peer, scheme (bf16 | fp8_channel | fp8_block), model (preset name), tokens (T), E, k,
H, I, time_us (median, empty unless ok), status (ok | skipped | error), reason (why not ok), rel_err
(max |y - ref| / max |ref|, ref the float32 MoE), graph (true: timed as a CUDA graph replay), jit_s
(DeepGEMM peers: seconds of JIT, see above).
"""
import argparse
import csv
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_deepgemm as pdg  # noqa: E402  (scripts/peers_deepgemm.py: load, scale layout, JIT warm-up)
from peers_deepgemm import load_deepgemm, short  # noqa: E402,F401

PRESETS = {"mixtral": (8, 2, 4096, 14336), "deepseek-v3": (256, 8, 7168, 2048), "qwen3-moe": (128, 8, 2048, 768)}
PEERS = [("torch_grouped_mm", "bf16"), ("torch_scaled_grouped_mm", "fp8_channel"),
         ("deepgemm", "fp8_block"), ("deepgemm", "bf16"), ("deepgemm_gemms", "fp8_block"), ("deepgemm_gemms", "bf16")]
COLUMNS = ["peer", "scheme", "model", "tokens", "E", "k", "H", "I", "time_us", "status", "reason", "rel_err", "graph",
           "jit_s"]
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
WARMUP = 3
FLUSH_BYTES = 256 << 20


# ---- routing, layout and combine (pure torch; tests/python/test_bench_peers.py runs them on the CPU)

def route(T, E, k, seed, device="cpu"):
    """Random top-k routing: ids [T, k] int64 (distinct per token), weights [T, k] f32 summing to 1."""
    logits = torch.randn((T, E), generator=torch.Generator().manual_seed(seed))
    top, ids = logits.topk(k, dim=1)
    return ids.to(device), top.softmax(dim=1).to(device)


def padded_rows(ids, E, align):
    """Host-side row count of the expert-grouped layout: each expert's entries rounded up to align."""
    counts = torch.bincount(ids.flatten().cpu(), minlength=E)
    return int(((counts + align - 1) // align * align).sum())


def expert_layout(ids, E, rows, align=1):
    """The grouped GEMM rows of the T*k (token, slot) entries, by expert, computed on ids' device.

    Returns (src, row, offs, m_idx): src[r] the token row r copies; row[f] the row that holds flat
    entry f = t * k + j; offs int32 end of each expert's rows (align 1: torch._grouped_mm's offs);
    m_idx[r] the expert of row r, -1 on padding (align > 1: each expert's rows start at a multiple
    of align, DeepGEMM's contiguous layout; None for align 1). rows: T*k, or padded_rows() for align > 1.
    """
    T, k = ids.shape
    n = T * k
    sorted_ids, order = torch.sort(ids.flatten(), stable=True)
    experts = torch.arange(E, device=ids.device)
    ends = torch.searchsorted(sorted_ids, experts, right=True)
    seq = torch.arange(n, device=ids.device)
    row = torch.empty_like(order)
    if align == 1:
        row[order] = seq
        return order // k, row, ends.to(torch.int32), None
    starts = torch.searchsorted(sorted_ids, experts)
    padded = (ends - starts + align - 1) // align * align
    pad_starts = torch.cumsum(padded, 0) - padded
    dest = pad_starts[sorted_ids] + seq - starts[sorted_ids]  # padded row of the i-th sorted entry
    # Padding rows copy token 0: valid data the GEMM skips (m_idx -1), never uninitialized memory.
    src = torch.zeros(rows, dtype=torch.long, device=ids.device)
    src[dest] = order // k
    m_idx = torch.full((rows,), -1, dtype=torch.int32, device=ids.device)
    m_idx[dest] = sorted_ids.to(torch.int32)
    row[order] = dest
    return src, row, ends.to(torch.int32), m_idx


def combine(y, row, weights):
    """out[t] = sum_j weights[t, j] * y[row[t * k + j]], summed in f32, returned in y's dtype."""
    T, k = weights.shape
    picked = y.index_select(0, row).view(T, k, -1)
    return (picked * weights.unsqueeze(-1)).sum(dim=1).to(y.dtype)


def silu_mul(g):
    """SiLU(gate) * up of the [M, 2I] gate-then-up GEMM1 output."""
    gate, up = g.chunk(2, dim=-1)
    return F.silu(gate) * up


def gather_rows(a, src):
    """a[src] for any dtype (fp8 rows go through uint8: index_select need not support float8)."""
    if a.dtype == FP8:
        return a.view(torch.uint8).index_select(0, src).view(FP8)
    return a.index_select(0, src)


# ---- quantization

def quant_rows(a):
    """Per-row e4m3 quantization of [..., K]: (a_fp8, f32 scales [...]), a ~= a_fp8 * scale."""
    s = a.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (a.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s.squeeze(-1)


def quant_1x128(a, block=128):
    """Per-row, per-block-of-K e4m3 quantization of [M, K]: (a_fp8, f32 scales [M, K/block])."""
    M, K = a.shape
    v = a.reshape(M, K // block, block).float()
    s = v.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
    return (v / s).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(M, K), s.squeeze(-1)


def quant_weights(w, block=None):
    """[E, N, K] weights to e4m3, one expert at a time (bounded temporaries): per output row
    (block None; scales [E, N]) or per block x block tile (scales [E, N/block, K/block])."""
    E, N, K = w.shape
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    s = torch.empty((E, N) if block is None else (E, N // block, K // block), device=w.device)
    for e in range(E):
        if block is None:
            q[e], s[e] = quant_rows(w[e])
            continue
        v = w[e].reshape(N // block, block, K // block, block).float()
        t = v.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / FP8_MAX
        q[e] = (v / t).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(N, K)
        s[e] = t.view(N // block, K // block)
    return q, s


# ---- the MoE forwards (timed)

def moe_grouped_mm(x, w1t, w2t, ids, weights, mm=None):
    """torch_grouped_mm: w1t / w2t the [E, K, N] transposed views of w1 / w2 (nn.Linear layout)."""
    mm = mm or torch._grouped_mm
    src, row, offs, _ = expert_layout(ids, w1t.shape[0], ids.numel())
    g = mm(x.index_select(0, src), w1t, offs=offs)
    y = mm(silu_mul(g), w2t, offs=offs)
    return combine(y, row, weights)


def moe_scaled_grouped_mm(x, w1q_t, s1, w2q_t, s2, ids, weights, mm=None):
    """torch_scaled_grouped_mm: e4m3 [E, K, N] transposed weight views with [E, N] row scales."""
    mm = mm or torch._scaled_grouped_mm
    src, row, offs, _ = expert_layout(ids, w1q_t.shape[0], ids.numel())
    xq, sx = quant_rows(x)  # T rows, then gathered: the same values as quantizing the T*k copies
    g = mm(gather_rows(xq, src), w1q_t, sx.index_select(0, src), s1, offs=offs, out_dtype=torch.bfloat16)
    hq, sh = quant_rows(silu_mul(g))
    y = mm(hq, w2q_t, sh, s2, offs=offs, out_dtype=torch.bfloat16)
    return combine(y, row, weights)


def moe_deepgemm(x, w1, w2, ids, weights, rows, align, gemm, fp8=None, block=128):
    """deepgemm: contiguous layout of `rows` padded rows; fp8 = ((w1q, s1), (w2q, s2)) block-scaled
    weights for fp8_block (gemm the fp8 entry point), None for bf16 (gemm the bf16 one)."""
    E, N1, H = w1.shape
    src, row, _, m_idx = expert_layout(ids, E, rows, align)
    g = torch.empty((rows, N1), dtype=x.dtype, device=x.device)
    y = torch.empty((rows, H), dtype=x.dtype, device=x.device)
    if fp8 is None:
        gemm(x.index_select(0, src), w1, g, m_idx)
        gemm(silu_mul(g), w2, y, m_idx)
    else:
        (w1q, s1), (w2q, s2) = fp8
        xq, sx = quant_1x128(x, block)
        gemm((gather_rows(xq, src), sx.index_select(0, src)), (w1q, s1), g, m_idx)
        hq, sh = quant_1x128(silu_mul(g), block)
        gemm((hq, sh), (w2q, s2), y, m_idx)
    return combine(y, row, weights)


def deepgemm_gemms(x, w1, w2, ids, weights, rows, align, gemm, fp8=None, block=128, sf=None):
    """deepgemm_gemms, the GEMM-only lower bound: prepares both GEMMs' inputs once (layout, gather,
    quantization, gemm1 run once for its real output, SiLU * up; sf(scales) relays 1x128 scales into
    the kernel's layout when given) and returns (fn, view): fn() runs only the two grouped GEMM calls
    and returns gemm2's [rows, H] output; view(y) combines its rows into [T, H] (for the check)."""
    E, N1, H = w1.shape
    src, row, _, m_idx = expert_layout(ids, E, rows, align)
    g = torch.zeros((rows, N1), dtype=x.dtype, device=x.device)  # padding rows stay finite
    y = torch.zeros((rows, H), dtype=x.dtype, device=x.device)
    sf = sf or (lambda s: s)
    if fp8 is None:
        a1, b1, b2 = x.index_select(0, src), w1, w2
        gemm(a1, b1, g, m_idx)
        a2 = silu_mul(g)
    else:
        (w1q, s1), (w2q, s2) = fp8
        xq, sx = quant_1x128(x, block)
        a1, b1, b2 = (gather_rows(xq, src), sf(sx.index_select(0, src))), (w1q, s1), (w2q, s2)
        gemm(a1, b1, g, m_idx)
        hq, sh = quant_1x128(silu_mul(g), block)
        a2 = (hq, sf(sh))

    def fn():
        gemm(a1, b1, g, m_idx)
        gemm(a2, b2, y, m_idx)
        return y
    return fn, lambda out: combine(out, row, weights)


def reference_moe(x, w1, w2, ids, weights):
    """float32 MoE on the same inputs: per expert hit, its rows' SiLU(gate) * up, down, weighted sum."""
    I = w2.shape[2]
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(ids).tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        g = xf[t] @ w1[e].float().t()
        h = F.silu(g[:, :I]) * g[:, I:]
        out.index_add_(0, t, (h @ w2[e].float().t()) * weights[t, j].unsqueeze(1))
    return out


# ---- timing and the grid

def time_cell(fn, ref, iters, flush, view=None):
    """(median us, rel_err, graph, first-call s) of fn: warm-up, CUDA-graph capture when it works,
    flushed runs. view(out), when given, maps fn's output to what ref holds (outside the timing)."""
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    first_s = time.time() - t0  # a DeepGEMM kernel's cubin load (or its compile) happens here
    for _ in range(WARMUP - 1):
        fn()
    torch.cuda.synchronize()
    run, graph = fn, False
    try:
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            static = fn()
        run, graph = (lambda: (cg.replay(), static)[1]), True
    except Exception:  # not capturable (a host sync, an allocation rule): time it eagerly
        torch.cuda.synchronize()
    out = run()
    torch.cuda.synchronize()
    out = view(out) if view else out
    rel_err = float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i in range(iters):
        flush.fill_(i & 0x7F)  # evicts L2 (50 MB on the H200) before every timed run
        ev[i][0].record()
        run()
        ev[i][1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev), rel_err, graph, first_s


def make_peer(peer, scheme, w1, w2, x, ids, weights, cache, dg):
    """(fn, view) of one cell: fn the zero-argument timed call, view None or what maps its output to
    [T, H] for the check. Untimed weight preparation is cached per model."""
    E = w1.shape[0]
    if peer == "torch_grouped_mm":
        w1t, w2t = w1.transpose(1, 2), w2.transpose(1, 2)
        return (lambda: moe_grouped_mm(x, w1t, w2t, ids, weights)), None
    if peer == "torch_scaled_grouped_mm":
        if "row" not in cache:
            cache["row"] = (quant_weights(w1), quant_weights(w2))
        (w1q, s1), (w2q, s2) = cache["row"]
        w1q_t, w2q_t = w1q.transpose(1, 2), w2q.transpose(1, 2)
        return (lambda: moe_scaled_grouped_mm(x, w1q_t, s1, w2q_t, s2, ids, weights)), None
    lib, align = dg
    rows = padded_rows(ids, E, align)
    fp8 = None
    gemm = lib.m_grouped_bf16_gemm_nt_contiguous
    if scheme == "fp8_block":
        if "block" not in cache:
            cache["block"] = (quant_weights(w1, 128), quant_weights(w2, 128))
        fp8, gemm = cache["block"], lib.m_grouped_fp8_gemm_nt_contiguous
    if peer == "deepgemm_gemms":
        if "relayout" not in cache:
            cache["relayout"] = pdg.relayout(lib)
        return deepgemm_gemms(x, w1, w2, ids, weights, rows, align, gemm, fp8, sf=cache["relayout"])
    return (lambda: moe_deepgemm(x, w1, w2, ids, weights, rows, align, gemm, fp8)), None


def dg_keys(scheme, E, H, I, rows):
    """The warm-up keys (scheme, E, N, K, M) of a DeepGEMM cell's two GEMMs: gate/up, then down."""
    return [(scheme, E, 2 * I, H, rows), (scheme, E, H, I, rows)]


def dg_plan(models, tokens, schemes, seed, align):
    """The warm-up jobs of every DeepGEMM cell of the grid (the row counts from the grid's routing)."""
    jobs = []
    for model in models:
        E, k, H, I = PRESETS[model]
        for T in tokens:
            rows = padded_rows(route(T, E, k, seed + 1000 + T)[0], E, align)
            jobs += [pdg.gemm_job(*key) for s in schemes for key in dg_keys(s, E, H, I, rows)]
    return jobs


def parse_args(argv):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(PRESETS))
    p.add_argument("--tokens", default="1,8,64,512,4096")
    p.add_argument("--schemes", default="bf16,fp8_channel,fp8_block")
    p.add_argument("--peers", default=",".join(dict.fromkeys(p for p, _ in PEERS)))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="peers.csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=400.0, help="start no cell after this many seconds")
    p.add_argument("--deepgemm-budget-s", type=float, default=120.0, help="seconds DeepGEMM cells may take in the grid")
    p.add_argument("--deepgemm-jobs", type=int, default=max(1, min(12, (os.cpu_count() or 4) - 2)),
                   help="JIT warm-up processes (0: compile inside the grid)")
    p.add_argument("--deepgemm-jit-budget-s", type=float, default=180.0, help="start no JIT warm-up job after it")
    p.add_argument("--deepgemm-jit-mem-gb", type=float, default=80.0, help="GPU memory of concurrent warm-up jobs")
    a = p.parse_args(argv)
    a.models, a.tokens = a.models.split(","), [int(t) for t in a.tokens.split(",")]
    a.schemes, a.peers = a.schemes.split(","), a.peers.split(",")
    unknown = [m for m in a.models if m not in PRESETS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; presets: {list(PRESETS)}")
    return a


def model_tensors(E, H, I, seed):
    """bf16 weights w1 [E, 2I, H], w2 [E, H, I] ~ N(0, 1/fan_in) on the GPU (activations stay O(1))."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w1 = torch.randn((E, 2 * I, H), generator=g, device="cuda", dtype=torch.bfloat16).mul_(H ** -0.5)
    w2 = torch.randn((E, H, I), generator=g, device="cuda", dtype=torch.bfloat16).mul_(I ** -0.5)
    return w1, w2


def dg_gate(key_sets, jit, warmed):
    """(status, reason, warm-up seconds) of a DeepGEMM cell from its GEMMs' warm-up results:
    ('', '', s) to time it; skipped when a kernel was not warmed, error when its warm-up failed."""
    if not warmed:
        return "", "", 0.0
    missing = [k for k in key_sets if k not in jit]
    if missing:
        return "skipped", "JIT warm-up did not reach it (--deepgemm-jit-budget-s)", 0.0
    errs = [jit[k][1] for k in key_sets if jit[k][1]]
    if errs:
        return "error", f"JIT warm-up: {errs[0]}", 0.0
    return "", "", sum(jit[k][0] for k in key_sets)


def main(argv=None):
    """Runs the grid; writes --out row by row and a table to stdout."""
    a = parse_args(argv)
    start, dg_spent = time.time(), 0.0
    cells = [(p, s) for p, s in PEERS if p in a.peers and s in a.schemes]
    needs = {"torch_grouped_mm": "_grouped_mm", "torch_scaled_grouped_mm": "_scaled_grouped_mm"}
    missing = {p: f"torch {torch.__version__} has no torch.{op}" for p, op in needs.items() if not hasattr(torch, op)}
    broken = "" if torch.cuda.is_available() else "no CUDA device"
    dg, dg_why = None, broken
    dg_schemes = list(dict.fromkeys(s for p, s in cells if p.startswith("deepgemm")))
    if not broken and dg_schemes:
        dg, dg_why = load_deepgemm()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda") if not broken else None
    jit, warmed = {}, False
    if dg is not None and a.deepgemm_jobs > 0:
        jobs = dg_plan(a.models, a.tokens, dg_schemes, a.seed, dg[1])
        budget = max(0.0, min(a.deepgemm_jit_budget_s, a.budget_s - (time.time() - start)))
        print(f"# deepgemm jit warm-up: {len(jobs)} jobs, {a.deepgemm_jobs} processes, {budget:.0f} s budget",
              flush=True)
        t0 = time.time()
        jit = pdg.prewarm(jobs, a.deepgemm_jobs, budget, a.deepgemm_jit_mem_gb * 2 ** 30, grace_s=45.0)
        failed = sum(1 for v in jit.values() if v[1])
        print(f"# deepgemm jit warm-up: {len(jit)} of {len({j['key'] for j in jobs})} done, {failed} failed, "
              f"{time.time() - t0:.0f} s", flush=True)
        # None worked (a GPU in exclusive-process mode refuses the workers' contexts, say): compile
        # in the grid instead, under --deepgemm-budget-s, where each cell reports its own error.
        warmed = failed < len(jit)
        if not warmed:
            print("# deepgemm jit warm-up: no job worked; the grid compiles on first calls", flush=True)
    print(f"{'peer':24} {'scheme':12} {'model':12} {'T':>5} {'time_us':>10} {'rel_err':>9} graph {'jit_s':>6} status")
    with open(a.out, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        for model in a.models:
            E, k, H, I = PRESETS[model]
            w1 = w2 = None
            cache, why = {}, broken or f"--budget-s {a.budget_s:g} spent"
            if not broken and time.time() - start < a.budget_s:
                try:
                    w1, w2 = model_tensors(E, H, I, a.seed + 17)
                except Exception as e:
                    why = f"weights: {short(e)}"
            for T in a.tokens:
                problem = None
                if w1 is not None:
                    try:
                        x = torch.randn((T, H), generator=torch.Generator().manual_seed(a.seed + T))
                        x = x.to("cuda", torch.bfloat16)
                        ids, weights = route(T, E, k, a.seed + 1000 + T, "cuda")
                        problem = (x, ids, weights, reference_moe(x, w1, w2, ids, weights))
                    except Exception as e:
                        why = f"inputs / reference: {short(e)}"
                for peer, scheme in cells:
                    r = dict(peer=peer, scheme=scheme, model=model, tokens=T, E=E, k=k, H=H, I=I, time_us="",
                             status="skipped", reason="", rel_err="", graph="", jit_s="")
                    is_dg = peer.startswith("deepgemm")
                    gate = ("", "", 0.0)
                    if is_dg and dg is not None and problem is not None:
                        gate = dg_gate(dg_keys(scheme, E, H, I, padded_rows(problem[1], E, dg[1])), jit, warmed)
                    if broken or problem is None:
                        r["reason"] = broken or why
                    elif time.time() - start > a.budget_s:
                        r["reason"] = f"--budget-s {a.budget_s:g} spent"
                    elif peer in missing or (is_dg and dg is None):
                        r["reason"] = missing.get(peer) or dg_why
                    elif gate[0]:
                        r.update(status=gate[0], reason=gate[1])
                    elif is_dg and dg_spent > a.deepgemm_budget_s:
                        r["reason"] = f"--deepgemm-budget-s {a.deepgemm_budget_s:g} spent"
                    else:
                        t0 = time.time()
                        x, ids, weights, ref = problem
                        try:
                            fn, view = make_peer(peer, scheme, w1, w2, x, ids, weights, cache, dg)
                            us, err, graph, first_s = time_cell(fn, ref, a.iters, flush, view)
                            r.update(status="ok", time_us=f"{us:.2f}", rel_err=f"{err:.3e}", graph=str(graph).lower())
                            r["jit_s"] = f"{gate[2] + first_s:.1f}" if is_dg else ""
                        except Exception as e:
                            r.update(status="error", reason=short(e))
                            try:
                                torch.cuda.synchronize()
                            except Exception as e2:  # a sticky CUDA error: nothing after it can run
                                broken = f"CUDA unusable after {peer}/{scheme}/{model}/T={T}: {short(e2)}"
                        dg_spent += (time.time() - t0) if is_dg else 0.0
                    out.writerow(r)
                    f.flush()
                    print(f"{peer:24} {scheme:12} {model:12} {T:>5} {r['time_us'] or '-':>10} {r['rel_err'] or '-':>9} "
                          f"{r['graph'] or '-':5} {r['jit_s'] or '-':>6} {r['status']} {r['reason']}", flush=True)
            # Drop every reference to this model's weights (fn's closure too) before the next model's.
            problem = w1 = w2 = cache = fn = view = x = ids = weights = ref = None
            if not broken:
                torch.cuda.empty_cache()
    print(f"# wrote {a.out} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: unwind, so the JIT workers end too
    sys.exit(main())
