"""scripts/bench_peers.py (the peers timed next to `moekit bench`, issue 32 item 4) on the CPU: the
routing generator, the expert-grouped row layouts (torch._grouped_mm's and DeepGEMM's padded one),
the weighted combine, the fp8 quantizers, and each peer's whole MoE forward with its library GEMM
replaced by a float32 emulation, against a loop over tokens and slots on a tiny problem (E 4, k 2,
H 32, I 16, T 5). torch_grouped_mm also runs torch._grouped_mm itself where the CPU build has it.
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


def emu_deepgemm(block):
    """DeepGEMM's m-grouped contiguous NT GEMM (fp8 (tensor, scales) pairs or bf16/f32 tensors): d[r] =
    a[r] @ b[m_idx[r]].T for the rows with m_idx >= 0; padding rows (-1) are left alone."""
    def gemm(a, b, d, m_idx):
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without a CUDA device")
def test_main_without_cuda_writes_skipped_rows(tmp_path, capsys):
    path = tmp_path / "peers.csv"
    assert bp.main(["--models", "qwen3-moe", "--tokens", "1,8", "--out", str(path)]) == 0
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bp.COLUMNS and len(rows) == 2 * len(bp.PEERS)
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
    us, err, graph = bp.time_cell(fn, ref.cuda(), 3, flush)
    assert us > 0 and err < 0.02 and isinstance(graph, bool)
