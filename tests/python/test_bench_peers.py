"""scripts/bench_peers.py (the peers timed next to `moekit bench`, issue 32 item 4) and its helper
scripts/peers_deepgemm.py on the CPU: the routing generator, the expert-grouped row layouts
(torch._grouped_mm's and DeepGEMM's padded one), the weighted combine, the fp8 quantizers, and each
peer's whole MoE forward with its library GEMM replaced by a float32 emulation, against a loop over
tokens and slots on a tiny problem (E 4, k 2, H 32, I 16, T 5); the GEMM-only DeepGEMM peer's
preparation (what its timed call runs, how its output is combined); the DeepGEMM JIT warm-up's plan,
its scheduler and its worker processes (which fail cleanly without DeepGEMM), and how a cell reads
the warm-up's results. torch_grouped_mm also runs torch._grouped_mm itself where the CPU build has it.
The CUDA cases (the real torch GEMMs, the CUDA-graph timing) skip without a device.
Run: python -m pytest tests/python/test_bench_peers.py
"""

import csv
import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_peers.py"
_spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
bp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bp)
pdg = bp.pdg  # scripts/peers_deepgemm.py, as bench_peers.py imports it

E, K, H, I, T = 4, 2, 32, 16, 5
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def problem(seed=0, device="cpu", dtype=torch.float32):
    """x [T, H], w1 [E, 2I, H], w2 [E, H, I] ~ N(0, 1/fan_in), ids / weights from bp.route."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=g)
    w1 = torch.randn((E, 2 * I, H), generator=g) * H ** -0.5
    w2 = torch.randn((E, H, I), generator=g) * I ** -0.5
    ids, weights = bp.route(T, E, K, seed + 1)
    return (x.to(device, dtype), w1.to(device, dtype), w2.to(device, dtype), ids.to(device), weights.to(device))


def loop_moe(x, w1, w2, ids, weights):
    """The plainest MoE: for each token and slot, the expert's SiLU(gate) * up, down, weighted, summed."""
    out = torch.zeros(x.shape[0], w2.shape[1])
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g = w1[e].float().cpu() @ x[t].float().cpu()
            out[t] += float(weights[t, j]) * (w2[e].float().cpu() @ (F.silu(g[:I]) * g[I:]))
    return out


def rel_err(actual, expected):
    return float((actual.float().cpu() - expected).abs().max() / expected.abs().max())


def emu_grouped_mm(a, bt, offs=None):
    """torch._grouped_mm in f32 loops: rows [offs[e-1], offs[e]) times bt[e] ([E, K, N])."""
    out, start = torch.zeros(a.shape[0], bt.shape[2]), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].float() @ bt[e].float()
        start = end
    return out.to(a.dtype)


def emu_scaled_grouped_mm(a, bt, sa, sb, offs=None, out_dtype=torch.bfloat16):
    """torch._scaled_grouped_mm, row-wise: dequantize (sa [M], sb [E, N]) and multiply in f32."""
    return emu_grouped_mm(a.float() * sa[:, None], bt.float() * sb[:, None, :], offs).to(out_dtype)


def emu_deepgemm(block, calls=None):
    """DeepGEMM's m-grouped contiguous NT GEMM (fp8 (tensor, scales) pairs or bf16/f32 tensors): d[r] =
    a[r] @ b[m_idx[r]].T for the rows with m_idx >= 0; padding rows (-1) are left alone. Appends
    (a, b, d) to calls when given."""
    def gemm(a, b, d, m_idx):
        if calls is not None:
            calls.append((a, b, d))
        if isinstance(a, tuple):
            (a, sa), (b, sb) = a, b
            a = a.float() * sa.repeat_interleave(block, 1)
            b = b.float() * sb.repeat_interleave(block, 1).repeat_interleave(block, 2)
        for r, e in enumerate(m_idx.tolist()):
            if e >= 0:
                d[r] = (b[e].float() @ a[r].float()).to(d.dtype)
    return gemm


def test_route_distinct_experts_weights_sum_to_one():
    ids, weights = bp.route(64, 16, 4, seed=3)
    assert ids.shape == weights.shape == (64, 4) and weights.dtype == torch.float32
    assert all(len(set(r)) == 4 for r in ids.tolist()) and 0 <= int(ids.min()) and int(ids.max()) < 16
    assert bool((weights > 0).all()) and torch.allclose(weights.sum(dim=1), torch.ones(64))
    again, _ = bp.route(64, 16, 4, seed=3)
    other, _ = bp.route(64, 16, 4, seed=4)
    assert torch.equal(ids, again) and not torch.equal(ids, other)


def test_plain_layout_groups_rows_by_expert():
    _, _, _, ids, _ = problem()
    src, row, offs, m_idx = bp.expert_layout(ids, E, T * K)
    assert m_idx is None and offs.dtype == torch.int32
    counts = torch.bincount(ids.flatten(), minlength=E)
    assert offs.tolist() == torch.cumsum(counts, 0).tolist()
    assert sorted(row.tolist()) == list(range(T * K))  # a permutation
    starts = [0] + offs.tolist()[:-1]
    for t in range(T):
        for j in range(K):
            r, e = int(row[t * K + j]), int(ids[t, j])
            assert int(src[r]) == t and starts[e] <= r < int(offs[e])


@pytest.mark.parametrize("align", [8, 128])
def test_padded_layout_is_deepgemm_contiguous(align):
    _, _, _, ids, _ = problem()
    rows = bp.padded_rows(ids, E, align)
    src, row, _, m_idx = bp.expert_layout(ids, E, rows, align)
    expected, counts = [], torch.bincount(ids.flatten(), minlength=E).tolist()
    for e, c in enumerate(counts):  # each expert's rows, then -1 up to the next multiple of align
        expected += [e] * c + [-1] * (-c % align)
    assert rows == len(expected) and rows % align == 0
    assert m_idx.dtype == torch.int32 and m_idx.tolist() == expected
    assert int(src[m_idx < 0].abs().sum()) == 0  # padding copies token 0
    for t in range(T):
        for j in range(K):
            r = int(row[t * K + j])
            assert int(src[r]) == t and int(m_idx[r]) == int(ids[t, j])


def test_combine_weights_and_sums_each_tokens_rows():
    _, _, _, ids, weights = problem()
    y = torch.randn(T * K + 3, H)
    row = torch.randperm(T * K + 3)[:T * K]
    out = bp.combine(y, row, weights)
    for t in range(T):
        ref = sum(float(weights[t, j]) * y[int(row[t * K + j])] for j in range(K))
        assert torch.allclose(out[t], ref, atol=1e-6)


def test_reference_moe_matches_loop():
    x, w1, w2, ids, weights = problem()
    assert rel_err(bp.reference_moe(x, w1, w2, ids, weights), loop_moe(x, w1, w2, ids, weights)) < 1e-5


def cpu_grouped_mm_works():
    try:
        torch._grouped_mm(torch.ones(2, 16), torch.ones(1, 16, 16), offs=torch.tensor([2], dtype=torch.int32))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@pytest.mark.parametrize("mm", ["emulated", "torch"])
def test_grouped_mm_forward_matches_loop(mm):
    if mm == "torch" and not cpu_grouped_mm_works():
        pytest.skip("this torch has no CPU torch._grouped_mm")
    x, w1, w2, ids, weights = problem()
    out = bp.moe_grouped_mm(x, w1.transpose(1, 2), w2.transpose(1, 2), ids, weights,
                            mm=emu_grouped_mm if mm == "emulated" else None)
    assert out.shape == (T, H) and rel_err(out, loop_moe(x, w1, w2, ids, weights)) < 1e-5


def test_quantizers_round_trip():
    w = torch.randn(3, 32, 48)
    q, s = bp.quant_weights(w)
    assert q.dtype == bp.FP8 and s.shape == (3, 32)
    assert rel_err(q.float() * s[..., None], w) < 0.07  # e4m3: 3 mantissa bits
    q, s = bp.quant_weights(w, block=16)
    assert s.shape == (3, 2, 3)
    back = q.float() * s.repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert rel_err(back, w) < 0.07
    a = torch.randn(5, 48) * torch.tensor([1e-3, 1.0, 1e3]).repeat_interleave(16)  # one scale per 16
    q, s = bp.quant_1x128(a, block=16)
    assert s.shape == (5, 3)
    back = (q.float().view(5, 3, 16) * s[..., None]).view(5, 48)
    assert bool(((back - a).abs() <= a.abs().view(5, 3, 16).amax(-1).repeat_interleave(16, 1) / 16).all())


def test_scaled_grouped_mm_forward_with_emulated_gemm():
    x, w1, w2, ids, weights = problem(dtype=torch.bfloat16)
    (w1q, s1), (w2q, s2) = bp.quant_weights(w1), bp.quant_weights(w2)
    out = bp.moe_scaled_grouped_mm(x, w1q.transpose(1, 2), s1, w2q.transpose(1, 2), s2, ids, weights,
                                   mm=emu_scaled_grouped_mm)
    assert out.dtype == torch.bfloat16 and rel_err(out, loop_moe(x, w1, w2, ids, weights)) < 0.1


@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_deepgemm_forward_with_emulated_gemm(scheme):
    x, w1, w2, ids, weights = problem()
    rows = bp.padded_rows(ids, E, 8)
    fp8 = (bp.quant_weights(w1, 16), bp.quant_weights(w2, 16)) if scheme == "fp8_block" else None
    out = bp.moe_deepgemm(x, w1, w2, ids, weights, rows, 8, emu_deepgemm(16), fp8=fp8, block=16)
    assert rel_err(out, loop_moe(x, w1, w2, ids, weights)) < (0.1 if fp8 else 1e-5)


@pytest.mark.parametrize("scheme", ["bf16", "fp8_block"])
def test_deepgemm_gemms_times_only_the_two_gemms(scheme):
    x, w1, w2, ids, weights = problem()
    rows = bp.padded_rows(ids, E, 8)
    fp8 = (bp.quant_weights(w1, 16), bp.quant_weights(w2, 16)) if scheme == "fp8_block" else None
    relaid = []

    def sf(s):  # a relayout that keeps the values (DeepGEMM's MN-major one changes strides only)
        relaid.append(s.shape)
        return s.t().contiguous().t()
    calls = []
    fn, view = bp.deepgemm_gemms(x, w1, w2, ids, weights, rows, 8, emu_deepgemm(16, calls), fp8=fp8, block=16,
                                 sf=sf)
    assert len(calls) == 1  # the preparation ran gemm1 once, for gemm2's real input
    assert relaid == ([] if fp8 is None else [(rows, H // 16), (rows, I // 16)])
    prepared = calls[0][0]
    calls.clear()
    y = fn()
    assert len(calls) == 2 and y.shape == (rows, H)  # the timed call: the two GEMMs and nothing else
    assert calls[0][0] is prepared and calls[1][2] is y
    a2 = calls[1][0][0] if fp8 else calls[1][0]
    assert a2.shape == (rows, I) and (a2.dtype == bp.FP8) == (fp8 is not None)
    out = view(y)
    composed = bp.moe_deepgemm(x, w1, w2, ids, weights, rows, 8, emu_deepgemm(16), fp8=fp8, block=16)
    assert out.shape == (T, H) and torch.equal(out, composed)  # the same numbers as the composed MoE
    assert rel_err(out, loop_moe(x, w1, w2, ids, weights)) < (0.1 if fp8 else 1e-5)
    calls.clear()
    assert torch.equal(fn(), y) and len(calls) == 2  # repeatable: inputs are not consumed


def test_deepgemm_plan_keys_match_the_cells():
    models, tokens = ["qwen3-moe", "mixtral"], [1, 64]
    jobs = bp.dg_plan(models, tokens, ["fp8_block", "bf16"], seed=0, align=128)
    assert len(jobs) == len(models) * len(tokens) * 2 * 2
    for model in models:
        E, k, H, I = bp.PRESETS[model]
        for T in tokens:
            ids, _ = bp.route(T, E, k, 1000 + T, "cpu")  # the grid's routing of (model, T), seed 0
            rows = bp.padded_rows(ids, E, 128)
            assert rows % 128 == 0 and rows >= T * k
            for scheme in ("fp8_block", "bf16"):
                keys = bp.dg_keys(scheme, E, H, I, rows)
                assert keys == [(scheme, E, 2 * I, H, rows), (scheme, E, H, I, rows)]
                assert all(any(j["key"] == key for j in jobs) for key in keys)
    big = next(j for j in jobs if j["key"] == ("bf16", 8, 2 * 14336, 4096, bp.padded_rows(
        bp.route(1, 8, 2, 1001)[0], 8, 128)))
    assert big["bytes"] >= 8 * 2 * 14336 * 4096 * 2  # the weights dominate a job's memory


def test_deepgemm_gate_reads_the_warm_up():
    k1, k2 = ("bf16", 4, 64, 32, 128), ("bf16", 4, 32, 32, 128)
    assert bp.dg_gate([k1, k2], {}, warmed=False) == ("", "", 0.0)  # no warm-up: compile in the grid
    assert bp.dg_gate([k1, k2], {k1: (3.0, ""), k2: (4.5, "")}, warmed=True) == ("", "", 7.5)
    status, reason, _ = bp.dg_gate([k1, k2], {k1: (3.0, "")}, warmed=True)
    assert status == "skipped" and "--deepgemm-jit-budget-s" in reason
    status, reason, _ = bp.dg_gate([k1, k2], {k1: (3.0, ""), k2: (9.0, "RuntimeError: NVCC failed")}, warmed=True)
    assert status == "error" and reason == "JIT warm-up: RuntimeError: NVCC failed"


def test_warm_up_scheduler_largest_first_under_the_memory_limit():
    jobs = sorted([pdg.gemm_job("bf16", 8, 256, 128, 128), pdg.gemm_job("fp8_block", 256, 4096, 7168, 1024),
                   pdg.gemm_job("bf16", 256, 4096, 7168, 1024)], key=lambda j: -j["bytes"])
    assert jobs[0]["key"][0] == "bf16" and jobs[0]["key"][1] == 256
    assert pdg.pick_next(jobs, 0, 1) == 0  # larger than the limit: runs, alone
    assert pdg.pick_next(jobs, 1, jobs[0]["bytes"]) == 1  # the next one that fits beside the running
    assert pdg.pick_next(jobs, jobs[0]["bytes"], jobs[0]["bytes"]) is None
    assert pdg.pick_next([], 0, 10) is None


def test_warm_up_workers_report_every_job():
    keys = [("bf16", 2, 256, 256, 128), ("fp8_block", 2, 256, 256, 128)]
    jobs = [pdg.gemm_job(*key) for key in keys] + [pdg.gemm_job(*keys[0])]  # a duplicate runs once
    lines = []
    done = pdg.prewarm(jobs, 2, 60.0, 1 << 40, log=lambda *a, **kw: lines.append(a[0]))
    assert set(done) == set(keys) and len(lines) == 2
    for sec, err in done.values():
        assert sec >= 0 and isinstance(err, str)
        if not torch.cuda.is_available():  # without a GPU (and DeepGEMM) each job fails, cleanly
            assert err
    assert pdg.prewarm(jobs, 2, -1.0, 1 << 40, log=lambda *a, **kw: None) == {}  # budget spent: none run


def test_deepgemm_load_and_scale_relayout_helpers():
    class Lib:
        @staticmethod
        def get_mn_major_tma_aligned_tensor(s):
            return s

    assert pdg.sf_transform(Lib()) is Lib.get_mn_major_tma_aligned_tensor
    assert pdg.sf_transform(object()) is None
    notes, s = [], torch.ones(4, 2)
    assert pdg.relayout(Lib(), log=lambda m, **kw: notes.append(m))(s) is s and notes == []

    class Broken:
        @staticmethod
        def get_mn_major_tma_aligned_tensor(s):
            raise RuntimeError("layout")
    fn = pdg.relayout(Broken(), log=lambda m, **kw: notes.append(m))
    assert fn(s) is s and fn(s) is s and len(notes) == 1 and "RuntimeError: layout" in notes[0]
    fn = pdg.relayout(object(), log=lambda m, **kw: notes.append(m))
    assert fn(s) is s and len(notes) == 2
    lib, why = pdg.load_deepgemm()
    assert (lib is None) == bool(why)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without a CUDA device")
def test_main_without_cuda_writes_skipped_rows(tmp_path, capsys):
    path = tmp_path / "peers.csv"
    assert bp.main(["--models", "qwen3-moe", "--tokens", "1,8", "--out", str(path)]) == 0
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bp.COLUMNS and len(rows) == 2 * len(bp.PEERS)
    assert {r["peer"] for r in rows} >= {"deepgemm", "deepgemm_gemms"}
    assert {r["status"] for r in rows} == {"skipped"} and rows[0]["reason"] == "no CUDA device"
    assert "qwen3-moe" in capsys.readouterr().out


@requires_cuda
def test_torch_peers_on_cuda_match_loop():
    x, w1, w2, ids, weights = problem(device="cuda", dtype=torch.bfloat16)
    ref = loop_moe(x, w1, w2, ids, weights)
    out = bp.moe_grouped_mm(x, w1.transpose(1, 2), w2.transpose(1, 2), ids, weights)
    assert rel_err(out, ref) < 0.02
    if torch.cuda.get_device_capability() in ((9, 0), (10, 0)):
        (w1q, s1), (w2q, s2) = bp.quant_weights(w1), bp.quant_weights(w2)
        out = bp.moe_scaled_grouped_mm(x, w1q.transpose(1, 2), s1, w2q.transpose(1, 2), s2, ids, weights)
        assert rel_err(out, ref) < 0.1
    fn = lambda: bp.moe_grouped_mm(x, w1.transpose(1, 2), w2.transpose(1, 2), ids, weights)  # noqa: E731
    flush = torch.empty(bp.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    us, err, graph, first_s = bp.time_cell(fn, ref.cuda(), 3, flush)
    assert us > 0 and err < 0.02 and isinstance(graph, bool) and first_s >= 0
    ys = bp.moe_grouped_mm(x, w1.transpose(1, 2), w2.transpose(1, 2), ids, weights)  # view maps rows to tokens
    us, err, _, _ = bp.time_cell(lambda: ys.repeat_interleave(K, 0), ref.cuda(), 2, flush,
                                 view=lambda y: y.view(T, K, H)[:, 0])
    assert err < 0.02
