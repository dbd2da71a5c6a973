"""Tests of python/moekit/reference.py against independently written formulations.

The oracles here do not share code with the reference: routing ranks with a Python tuple sort per
row in float64 (the reference uses stable torch sorts in f32), fused_experts is a dense
all-experts einsum in float64 over a [T, E] routing matrix (the reference gathers tokens per
expert in f32), quantization tiles with explicit Python loops, the shuffle uses SPEC 4's closed
form index, and the fp8 cast is checked bit for bit against tests/data/dtype_golden.json.
Run: PYTHONPATH=python /work/venv-torch/bin/python -m pytest tests/python/test_reference.py
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from moekit import reference as R

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "dtype_golden.json"
INF, NAN = float("inf"), float("nan")


# ---------------------------------------------------------------- routing oracles (float64)
def _key(v):
    return -math.inf if math.isnan(v) else v


def oracle_rank(scores, k, eligible=None):
    """Top-k of one row: eligible first, then higher score (NaN = -inf), then lower index."""
    n = len(scores)
    elig = eligible if eligible is not None else [True] * n
    return sorted(range(n), key=lambda e: (not elig[e], -_key(scores[e]), e))[:k]


def oracle_softmax(row):
    x = [_key(v) for v in row]
    mx = max(x)
    if mx == math.inf:
        n_inf = sum(v == math.inf for v in x)
        return [1.0 / n_inf if v == math.inf else 0.0 for v in x]
    if mx == -math.inf:
        return [0.0] * len(x)
    e = [math.exp(v - mx) for v in x]
    return [v / sum(e) for v in e]


def oracle_sigmoid(v):
    v = _key(v)
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0


def oracle_fused_topk(gating, k, renorm):
    ws, ids = [], []
    for row in gating.double().tolist():
        p = oracle_softmax(row)
        pick = oracle_rank(p, k)
        w = [p[e] for e in pick]
        if renorm and sum(w) > 0:
            w = [v / sum(w) for v in w]
        ws.append(w)
        ids.append(pick)
    return torch.tensor(ws, dtype=torch.float64).reshape(-1, k), torch.tensor(ids, dtype=torch.int32).reshape(-1, k)


def oracle_grouped_topk(gating, k, renorm, n_group, topk_group, scoring, bias, rsf):
    E = gating.shape[1]
    gs = E // n_group
    ws, ids = [], []
    for row in gating.double().tolist():
        s = oracle_softmax(row) if scoring == "softmax" else [oracle_sigmoid(v) for v in row]
        b = [_key(s[e] + (float(bias[e]) if bias is not None else 0.0)) for e in range(E)]
        group_score = []
        for g in range(n_group):
            members = sorted(b[g * gs:(g + 1) * gs], reverse=True)
            group_score.append(sum(members[:2]) if bias is not None else members[0])
        kept = oracle_rank(group_score, topk_group)
        elig = [e // gs in kept for e in range(E)]
        pick = oracle_rank([b[e] if elig[e] else -math.inf for e in range(E)], k, elig)
        w = [s[e] for e in pick]
        if renorm and sum(w) > 0:
            w = [v / sum(w) for v in w]
        ws.append([v * rsf for v in w])
        ids.append(pick)
    return torch.tensor(ws, dtype=torch.float64).reshape(-1, k), torch.tensor(ids, dtype=torch.int32).reshape(-1, k)


def check_routing(got, want, atol=2e-6):
    """got: (weights, ids) or fused_topk's (weights, ids, token_expert_indices); want: (weights, ids)."""
    (w, ids), (w_want, ids_want) = got[:2], want
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    if len(got) == 3:  # token_expert_indices[t, j] = j * T + t
        T, k = ids.shape
        assert got[2].dtype == torch.int32 and got[2].tolist() == [[j * T + t for j in range(k)] for t in range(T)]
    assert torch.equal(ids, ids_want), f"ids differ:\n{ids}\n{ids_want}"
    torch.testing.assert_close(w.double(), w_want, rtol=1e-6, atol=atol)


# ---------------------------------------------------------------- routing tests
EDGE_ROWS = {
    "tied": [1.0, 3.0, 3.0, 0.5, 3.0, -2.0],
    "nan": [NAN, 0.3, NAN, 2.0, -1.0, 0.1],
    "all_nan": [NAN] * 6,
    "pos_inf": [INF, 0.0, INF, 1.0, NAN, -INF],
    "neg_inf": [-INF, -INF, 0.5, -INF, 0.2, -INF],
    "all_equal": [0.25] * 6,
}


@pytest.mark.parametrize("name", sorted(EDGE_ROWS))
@pytest.mark.parametrize("k", [1, 2, 6])
def test_fused_topk_edge_rows(name, k):
    g = torch.tensor([EDGE_ROWS[name]], dtype=torch.float32)
    for renorm in (False, True):
        check_routing(R.ref_fused_topk(g, g, k, renorm), oracle_fused_topk(g, k, renorm))


def test_fused_topk_all_nan_row_is_ids_0_to_k_weight_0():
    w, ids, _ = R.ref_fused_topk(torch.zeros(1, 4), torch.full((1, 4), NAN), 3, True)
    assert ids.tolist() == [[0, 1, 2]] and w.tolist() == [[0.0, 0.0, 0.0]]


def test_fused_topk_empty_and_single_token():
    w, ids, _ = R.ref_fused_topk(torch.zeros(0, 8), torch.zeros(0, 8), 2, True)
    assert w.shape == (0, 2) and ids.shape == (0, 2)
    g = torch.randn(1, 8)
    check_routing(R.ref_fused_topk(g, g, 8, False), oracle_fused_topk(g, 8, False))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("E,k", [(8, 2), (60, 4), (128, 8)])
def test_fused_topk_random(seed, dtype, E, k):
    torch.manual_seed(seed)
    g = (torch.randn(33, E) * 3).to(dtype)  # bf16 / f16 logits tie now and then: ties go to the lower id
    check_routing(R.ref_fused_topk(g, g, k, True), oracle_fused_topk(g, k, True))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("E,n_group,topk_group,k", [(16, 4, 2, 4), (64, 8, 4, 8), (12, 3, 1, 2), (8, 8, 3, 3)])
def test_grouped_topk_random(seed, scoring, with_bias, E, n_group, topk_group, k):
    torch.manual_seed(seed)
    g = torch.randn(17, E).bfloat16()
    bias = torch.randn(E) * 0.1 if with_bias else None
    got = R.ref_grouped_topk(g, g, k, True, n_group, topk_group, scoring, 2.5, bias)
    check_routing(got, oracle_grouped_topk(g, k, True, n_group, topk_group, scoring, bias, 2.5), atol=1e-5)


def test_grouped_topk_edge_rows():
    g = torch.tensor([EDGE_ROWS[n] + EDGE_ROWS[n][:2] for n in sorted(EDGE_ROWS)], dtype=torch.float32)  # E = 8
    for scoring in ("softmax", "sigmoid"):
        for bias in (None, torch.tensor([0.0, 0.1, -INF, 0.0, 0.2, 0.0, 0.0, -0.1])):
            for renorm in (False, True):
                got = R.ref_grouped_topk(g, g, 3, renorm, 4, 2, scoring, 1.0, bias)
                check_routing(got, oracle_grouped_topk(g, 3, renorm, 4, 2, scoring, bias, 1.0))


def test_grouped_topk_dropped_groups_rank_below_kept_minus_inf():
    # Group 0 is kept but holds a -inf bias expert; the pick must still come from group 0.
    g = torch.tensor([[1.0, 1.0, 1.0, -5.0, -5.0, -5.0]])
    bias = torch.tensor([0.0, -INF, 0.0, 0.0, 0.0, 0.0])
    _, ids = R.ref_grouped_topk(g, g, 3, False, 2, 1, "sigmoid", 1.0, bias)
    assert ids.tolist() == [[0, 2, 1]]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [1, 2])
def test_sigmoid_topk(seed, k):
    torch.manual_seed(seed)
    g = torch.cat([torch.randn(9, 16).bfloat16().float(), torch.tensor([EDGE_ROWS["nan"] * 2 + [0.0] * 4])])
    w, ids = R.ref_sigmoid_topk(g, k)
    ids_want = [oracle_rank(row, k) for row in g.tolist()]
    w_want = [[oracle_sigmoid(row[e]) for e in pick] for row, pick in zip(g.tolist(), ids_want)]
    assert ids.tolist() == ids_want
    torch.testing.assert_close(w.double(), torch.tensor(w_want, dtype=torch.float64), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("call,match", [
    (lambda g: R.ref_fused_topk(g, g, 0, True), r"topk: must be in \[1, 8\], got 0"),
    (lambda g: R.ref_fused_topk(g, g, 9, True), r"topk: must be in \[1, 8\], got 9"),
    (lambda g: R.ref_fused_topk(g[:2], g, 2, True), r"hidden_states: .*got shape \[2, 8\]"),
    (lambda g: R.ref_fused_topk(g.int(), g.int(), 2, True), r"gating_output: dtype"),
    (lambda g: R.ref_grouped_topk(g, g, 2, True, 3, 1), r"num_expert_group: .* got 3"),
    (lambda g: R.ref_grouped_topk(g, g, 2, True, 4, 5), r"topk_group: .* got 5"),
    (lambda g: R.ref_grouped_topk(g, g, 5, True, 4, 2), r"topk \(<= topk_group .*\[1, 4\], got 5"),
    (lambda g: R.ref_grouped_topk(g, g, 2, True, 4, 2, "relu"), r"scoring_func: .*'relu'"),
    (lambda g: R.ref_grouped_topk(g, g, 2, True, 4, 2, "sigmoid", 1.0, torch.zeros(7)),
     r"e_score_correction_bias: .*\[7\]"),
    (lambda g: R.ref_sigmoid_topk(g, 9), r"topk: .*got 9"),
])
def test_routing_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 8))


# ---------------------------------------------------------------- fp8 cast and quantizers
def _golden():
    return json.loads(GOLDEN.read_text())


def _f32_from_bits(bits):
    return torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32).copy())


@pytest.mark.parametrize("dtype,column", [(torch.float8_e4m3fn, "e4m3fn_clamped_cast_bits"),
                                          (torch.float8_e4m3fnuz, "e4m3fnuz_clamped_cast_bits")])
def test_cast_fp8_matches_golden_bits(dtype, column):
    d = _golden()
    x = _f32_from_bits(d["inputs_f32_bits"])
    got = R.ref_cast_fp8(x, dtype).view(torch.uint8).tolist()
    nan_codes = {0x7F, 0xFF} if dtype == torch.float8_e4m3fn else {0x80}
    for i, (g, want) in enumerate(zip(got, d[column])):
        if math.isnan(float(x[i])):
            assert g in nan_codes and want in nan_codes, (i, g, want)
        else:
            assert g == want, f"input {float(x[i])!r}: got code {g:#x}, golden {want:#x}"


@pytest.mark.parametrize("dtype,column", [(torch.float8_e4m3fn, "e4m3fn_decode_f32_bits"),
                                          (torch.float8_e4m3fnuz, "e4m3fnuz_decode_f32_bits")])
def test_fp8_decode_matches_golden(dtype, column):
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    want = _f32_from_bits(_golden()[column])
    assert torch.equal(torch.isnan(values), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(values[ok], want[ok])


def oracle_quantize(x, bn, bk, fp8_max):
    """Loops over (rows x cols) tiles of a 2-D f32 array: scales [RB, CB] and x / scale (f32)."""
    a = x.float().numpy()
    R_, C_ = a.shape
    RB, CB = -(-R_ // bn), -(-C_ // bk)
    scale = np.zeros((RB, CB), dtype=np.float32)
    div = np.zeros_like(a)
    for rb in range(RB):
        for cb in range(CB):
            tile = a[rb * bn:(rb + 1) * bn, cb * bk:(cb + 1) * bk]
            finite = tile[np.isfinite(tile)]
            amax = np.float32(np.abs(finite).max()) if finite.size else np.float32(0)
            s = np.float32(max(amax, np.float32(1e-12))) / np.float32(fp8_max)
            scale[rb, cb] = s
            div[rb * bn:(rb + 1) * bn, cb * bk:(cb + 1) * bk] = tile / s
    return torch.from_numpy(scale), torch.from_numpy(div)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_row", "per_token_group", "block"])
@pytest.mark.parametrize("shape", [(3, 40, 200), (1, 128, 256), (2, 5, 7)])
def test_quantize_fp8_tiles(dtype, granularity, shape):
    torch.manual_seed(sum(shape))
    x = (torch.randn(shape) * 4).bfloat16()
    x[0, 0, :3] = torch.tensor([INF, NAN, 0.0])
    if shape[1] > 1:
        x[0, 1] = 0.0  # an all-zero row gets the floor scale
    q, s = R.ref_quantize_fp8(x, granularity, group=64, block=(32, 64), dtype=dtype)
    fp8_max = R.FP8_MAX[dtype]
    B, N, K = shape
    for b in range(B):
        mat = x[b].float()
        if granularity == "per_tensor":
            s_want, div = oracle_quantize(x.reshape(1, -1), 1, x.numel(), fp8_max)
            div = div.reshape(shape)[b]
        else:
            bn, bk = {"per_row": (1, K), "per_token_group": (1, 64), "block": (32, 64)}[granularity]
            s_want, div = oracle_quantize(mat, bn, bk, fp8_max)
        got_s = s.reshape(-1) if granularity == "per_tensor" else s[b].reshape(s_want.shape)
        assert torch.equal(got_s, s_want.reshape(got_s.shape)), granularity
        want_q = div.clamp(-fp8_max, fp8_max).to(dtype)
        assert torch.equal(q[b].view(torch.uint8), want_q.view(torch.uint8))
    want_shape = {"per_tensor": [1], "per_row": [B, N, 1], "per_token_group": [B, N, -(-K // 64)],
                  "block": [B, -(-N // 32), -(-K // 64)]}[granularity]
    assert list(s.shape) == want_shape


def test_quantize_fp8_static_scale_and_errors():
    x = torch.randn(4, 8)
    q, s = R.ref_quantize_fp8(x, "per_tensor", scale=torch.tensor([0.01]))
    assert torch.equal(q.view(torch.uint8), (x / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    with pytest.raises(ValueError, match=r"scale: static per-tensor scale must be finite and > 0, got 0.0"):
        R.ref_quantize_fp8(x, "per_tensor", scale=torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"scale: a static scale needs granularity 'per_tensor', got 'per_row'"):
        R.ref_quantize_fp8(x, "per_row", scale=torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"granularity: .*'per_col'"):
        R.ref_quantize_fp8(x, "per_col")
    with pytest.raises(ValueError, match=r"x: block needs at least 2 dims, got shape \[8\]"):
        R.ref_quantize_fp8(x[0], "block")
    with pytest.raises(ValueError, match=r"dtype: .*torch.bfloat16"):
        R.ref_quantize_fp8(x, dtype=torch.bfloat16)
    q, s = R.ref_quantize_fp8(torch.zeros(0, 8), "per_row")
    assert q.shape == (0, 8) and s.shape == (0, 1)


def test_convert_fp8_fnuz_to_fn_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    q = codes.view(torch.float8_e4m3fnuz)
    scale = torch.tensor([0.75, 3.0])
    out, s_out = R.ref_convert_fp8_fnuz_to_fn(q.reshape(2, 128), scale)
    assert out.dtype == torch.float8_e4m3fn and torch.equal(s_out, scale * 0.5)
    got = (out.float() * s_out[:, None]).reshape(-1)
    want = (q.float().reshape(2, 128) * scale[:, None]).reshape(-1)
    for c in range(256):
        if c == 0x80:
            assert got[c] == 0.0  # fnuz NaN -> 0
        elif c & 0x7F == 0x7F:
            assert got[c] == math.copysign(448.0, want[c]) * float(s_out[c // 128])  # +-240 saturates
        else:
            assert got[c] == want[c], c
    with pytest.raises(ValueError, match=r"q: dtype must be torch.float8_e4m3fnuz, got torch.float8_e4m3fn"):
        R.ref_convert_fp8_fnuz_to_fn(out, s_out)


# ---------------------------------------------------------------- shuffle (SPEC 4 closed form)
def closed_form_index(N, K, elem_bytes):
    n, c = np.meshgrid(np.arange(N), np.arange(K), indexing="ij")
    V = 16 // elem_bytes
    return (((n // 16 * (K // 32) + c // 32) * (32 // V) + (c % 32) // V) * 16 + n % 16) * V + c % V


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(16, 32), (3, 48, 64), (2, 2, 32, 96)])
def test_shuffle_weight_closed_form(dtype, shape):
    w = torch.randn(shape).to(dtype)
    s = R.ref_shuffle_weight(w)
    assert s.shape == w.shape and s.dtype == dtype and s.is_contiguous()
    N, K = shape[-2:]
    idx = torch.from_numpy(closed_form_index(N, K, w.element_size()).reshape(-1))
    src = w.reshape(-1, N * K).view(torch.uint8 if w.element_size() == 1 else w.dtype)
    dst = s.reshape(-1, N * K).view(src.dtype)
    for m in range(src.shape[0]):
        assert torch.equal(dst[m][idx].view(torch.uint8), src[m].view(torch.uint8))
    assert torch.equal(R.ref_unshuffle_weight(s).view(torch.uint8), w.view(torch.uint8))


def test_shuffle_weight_errors():
    with pytest.raises(ValueError, match=r"w: N \(dim -2\) must be a multiple of 16, got 8"):
        R.ref_shuffle_weight(torch.zeros(8, 32))
    with pytest.raises(ValueError, match=r"w: K \(dim -1\) must be a multiple of 32, got 48"):
        R.ref_unshuffle_weight(torch.zeros(16, 48))
    with pytest.raises(ValueError, match=r"layout: only \(16, 16\) is supported, got \(32, 16\)"):
        R.ref_shuffle_weight(torch.zeros(16, 32), layout=(32, 16))
    with pytest.raises(ValueError, match=r"w: must have 2-4 dims"):
        R.ref_shuffle_weight(torch.zeros(32))


# ---------------------------------------------------------------- fused_experts: dense float64 oracle
def oracle_act(z, act):
    if act == "silu":
        return z * torch.sigmoid(z)
    if act == "gelu":
        return torch.nn.functional.gelu(z)
    return torch.nn.functional.gelu(z, approximate="tanh")


def oracle_fp8_values(v):
    """Dynamic per-row e4m3fn quant of a float64 tensor along its last dim, dequantized."""
    amax = torch.nan_to_num(v.abs(), nan=0.0).amax(-1, keepdim=True)
    s = amax.clamp_min(1e-12) / 448.0
    return (v / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s


def oracle_fp8_groups(v, bk):
    return torch.cat([oracle_fp8_values(v[..., c:c + bk]) for c in range(0, v.shape[-1], bk)], dim=-1)


def oracle_dequant_weight(q, scale, bn=None, bk=None):
    """fp8 weights [E, N, K] with [E], [E, N(, 1)] or block scales -> float64 values."""
    E, N, K = q.shape
    if bn is not None:
        full = scale.double().repeat_interleave(bn, 1)[:, :N].repeat_interleave(bk, 2)[:, :, :K]
    else:
        full = scale.double().reshape(E, -1, 1).expand(E, N, 1)
    return q.double() * full


def oracle_fused_experts(x, w1, w2, wts, ids, act="silu", on_input=False, expert_map=None, scheme="bf16",
                         scales=None, bk=None, bn=None, round_a=True, a1_scale=None):
    """Dense float64 MoE: every expert on every token, combined by a [T, E] routing matrix."""
    T, H = x.shape
    E, N1, inter = w1.shape[0], w1.shape[1], w2.shape[2]
    if scheme == "bf16":
        W1, W2 = w1.double(), w2.double()
    else:
        W1 = oracle_dequant_weight(w1, scales[0], bn, bk)
        W2 = oracle_dequant_weight(w2, scales[1], bn, bk)
    local = ids.long()
    if expert_map is not None:
        local = torch.where(local >= 0, expert_map.long()[local.clamp_min(0)], local)
    route = torch.zeros(T, E, dtype=torch.float64)  # route[t, e] = sum of the weights sending t to e
    for t in range(T):
        for j in range(ids.shape[1]):
            if local[t, j] >= 0:
                route[t, local[t, j]] += float(wts[t, j])
    xd = x.double()
    if scheme == "fp8_row" and a1_scale is not None:
        xd = (xd / float(a1_scale)).clamp(-448, 448).to(torch.float8_e4m3fn).double() * float(a1_scale)
    elif scheme == "fp8_row":
        xd = oracle_fp8_values(xd)
    elif scheme == "fp8_block":
        xd = oracle_fp8_groups(xd, bk)
    h = torch.einsum("th,enh->ten", xd, W1)
    if on_input:  # k == 1: the weight scales the expert input, the output is not weighted
        h = h * route.unsqueeze(-1)
        route = (route != 0).double()
    a = oracle_act(h[..., :inter], act) * h[..., inter:] if N1 == 2 * inter else oracle_act(h, act)
    if scheme == "bf16" and round_a:
        a = a.to(x.dtype).double()
    elif scheme == "fp8_row":
        a = oracle_fp8_values(a)
    elif scheme == "fp8_block":
        a = oracle_fp8_groups(a, bk)
    y = torch.einsum("tei,ehi->teh", a, W2)
    return torch.einsum("te,teh->th", route, y)


def make_moe(T, H, inter, E, k, dtype=torch.bfloat16, seed=0, g1u1=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=gen).to(dtype)
    w1 = (torch.randn(E, (2 if g1u1 else 1) * inter, H, generator=gen) / math.sqrt(H)).to(dtype)
    w2 = (torch.randn(E, H, inter, generator=gen) / math.sqrt(inter)).to(dtype)
    logits = torch.randn(T, E, generator=gen)
    wts, ids, _ = R.ref_fused_topk(x, logits, k, True)
    return x, w1, w2, wts, ids


def sigmoid_weights(wts):
    """Router weights in (0.2, 0.8) (top-1 softmax weights are all 1, which would hide a lost weight)."""
    gen = torch.Generator().manual_seed(wts.shape[0])
    return 0.2 + 0.6 * torch.rand(wts.shape, generator=gen)


def assert_close_rms(got, want, rtol, atol_rms):
    """|got - want| <= rtol * |want| + atol_rms * rms(want) elementwise; names the worst element."""
    want = want.double()
    rms = want.pow(2).mean().sqrt().clamp_min(1e-30) if want.numel() else 1.0
    excess = (got.double() - want).abs() - (rtol * want.abs() + atol_rms * rms)
    if excess.numel() and excess.max() > 0:
        t, h = divmod(int(excess.argmax()), got.shape[-1])
        raise AssertionError(f"[{t}, {h}]: got {float(got[t, h]):.6g}, want {float(want[t, h]):.6g} "
                             f"(rtol {rtol}, atol {atol_rms} * rms {float(rms):.3g})")


# Tolerances (rtol, atol as a fraction of the output RMS). The oracle is float64 and unrounded: the
# reference rounds its f32 result once to the output dtype (at most half an ulp: 2^-8 relative for
# bf16, 2^-11 for f16) and rounds a to that dtype before the down projection, as the oracle does
# from float64 (a value that rounds the other way moves one term of a dot by an ulp: the atol).
# fp8: the oracle quantizes float64 activations, the reference f32 ones; a code that lands on the
# other side of a rounding boundary moves one term of a dot by 2^-3 relative, so atol is 0.03 of
# the RMS (a misapplied scale or a wrong group is off by far more).
TOL = {torch.bfloat16: (2 ** -8, 2 ** -8), torch.float16: (2 ** -11, 2 ** -10), torch.float32: (1e-6, 1e-5)}
FP8_TOL = (2 ** -8, 0.03)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("T,H,inter,E,k", [(1, 64, 32, 4, 2), (19, 128, 96, 8, 2), (7, 64, 64, 16, 4),
                                            (5, 96, 40, 6, 6)])
def test_fused_experts_unquantized(dtype, act, T, H, inter, E, k):
    x, w1, w2, wts, ids = make_moe(T, H, inter, E, k, dtype, seed=T + E)
    out = R.ref_fused_experts(x, w1, w2, wts, ids, activation=act)
    assert out.dtype == dtype and out.shape == (T, H)
    assert_close_rms(out, oracle_fused_experts(x, w1, w2, wts, ids, act), *TOL[dtype])


def test_fused_experts_int64_ids_and_bf16_weights_are_converted():
    x, w1, w2, wts, ids = make_moe(7, 64, 32, 4, 2, seed=11)
    want = R.ref_fused_experts(x, w1, w2, wts.bfloat16().float(), ids)
    assert torch.equal(R.ref_fused_experts(x, w1, w2, wts.bfloat16(), ids.long()), want)


def test_fused_experts_g1u0_round_intermediate_off_and_out_argument():
    x, w1, w2, wts, ids = make_moe(9, 64, 32, 4, 2, seed=3, g1u1=False)
    dst = torch.empty_like(x)
    got = R.ref_fused_experts(x, w1, w2, wts, ids, out=dst, round_intermediate=False)
    assert got is dst
    assert_close_rms(dst, oracle_fused_experts(x, w1, w2, wts, ids, round_a=False), *TOL[torch.bfloat16])


def test_fused_experts_edge_cases():
    # T = 0, all tokens to one expert (others empty), E > T, -1 ids, k = E.
    x, w1, w2, wts, ids = make_moe(0, 64, 32, 4, 2)
    assert R.ref_fused_experts(x, w1, w2, wts, ids).shape == (0, 64)
    x, w1, w2, wts, ids = make_moe(5, 64, 32, 16, 2, seed=1)
    one = torch.full_like(ids, 3)
    bf16 = TOL[torch.bfloat16]
    assert_close_rms(R.ref_fused_experts(x, w1, w2, wts, one), oracle_fused_experts(x, w1, w2, wts, one), *bf16)
    holes = ids.clone()
    holes[0, :] = -1
    holes[1, 1] = -1
    got = R.ref_fused_experts(x, w1, w2, wts, holes)
    assert torch.all(got[0] == 0)
    assert_close_rms(got, oracle_fused_experts(x, w1, w2, wts, holes), *bf16)
    x, w1, w2, wts, ids = make_moe(3, 64, 32, 4, 4, seed=2)
    assert_close_rms(R.ref_fused_experts(x, w1, w2, wts, ids), oracle_fused_experts(x, w1, w2, wts, ids), *bf16)


def test_fused_experts_expert_map():
    # 8 global experts, this rank holds 3 of them (global 1, 4, 6 -> local 0, 1, 2).
    x, _, _, wts, ids = make_moe(23, 64, 32, 8, 2, seed=4)
    _, w1, w2, _, _ = make_moe(1, 64, 32, 3, 1, seed=5)
    expert_map = torch.full((8,), -1, dtype=torch.int32)
    expert_map[torch.tensor([1, 4, 6])] = torch.tensor([0, 1, 2], dtype=torch.int32)
    got = R.ref_fused_experts(x, w1, w2, wts, ids, expert_map=expert_map, global_num_experts=8)
    assert_close_rms(got, oracle_fused_experts(x, w1, w2, wts, ids, expert_map=expert_map), *TOL[torch.bfloat16])
    remote = ~torch.isin(ids, torch.tensor([1, 4, 6], dtype=torch.int32)).any(1)
    assert remote.any() and torch.all(got[remote] == 0)  # tokens whose experts are all remote


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_experts_weight_on_input(dtype):
    x, w1, w2, _, _ = make_moe(13, 64, 32, 4, 1, dtype, seed=6)
    wts, ids = R.ref_sigmoid_topk(torch.randn(13, 4), 1)
    got = R.ref_fused_experts(x, w1, w2, wts, ids, apply_router_weight_on_input=True)
    assert_close_rms(got, oracle_fused_experts(x, w1, w2, wts, ids, on_input=True), *TOL[dtype])


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
@pytest.mark.parametrize("on_input", [False, True])
@pytest.mark.parametrize("T,H,inter,E", [(1, 64, 32, 4), (17, 128, 96, 8)])
def test_fused_experts_fp8_row(granularity, on_input, T, H, inter, E):
    k = 1 if on_input else 2
    x, w1, w2, wts, ids = make_moe(T, H, inter, E, k, seed=7 + T)
    wts = sigmoid_weights(wts) if on_input else wts
    if granularity == "per_tensor":  # one scale per expert [E]
        q1, s1 = zip(*[R.ref_quantize_fp8(w, "per_tensor") for w in w1])
        q2, s2 = zip(*[R.ref_quantize_fp8(w, "per_tensor") for w in w2])
        q1, q2, s1, s2 = torch.stack(q1), torch.stack(q2), torch.cat(s1), torch.cat(s2)
    else:
        (q1, s1), (q2, s2) = R.ref_quantize_fp8(w1, "per_row"), R.ref_quantize_fp8(w2, "per_row")
    got = R.ref_fused_experts(x, q1, q2, wts, ids, use_fp8_w8a8=True, per_channel_quant=granularity == "per_row",
                              w1_scale=s1, w2_scale=s2, apply_router_weight_on_input=on_input)
    want = oracle_fused_experts(x, q1, q2, wts, ids, on_input=on_input, scheme="fp8_row", scales=(s1, s2))
    assert_close_rms(got, want, *FP8_TOL)


def test_fused_experts_fp8_row_static_activation_scale():
    x, w1, w2, wts, ids = make_moe(6, 64, 32, 4, 2, seed=8)
    (q1, s1), (q2, s2) = R.ref_quantize_fp8(w1, "per_row"), R.ref_quantize_fp8(w2, "per_row")
    a1 = torch.tensor([float(x.float().abs().max()) / 448.0])
    got = R.ref_fused_experts(x, q1, q2, wts, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2, a1_scale=a1)
    want = oracle_fused_experts(x, q1, q2, wts, ids, scheme="fp8_row", scales=(s1, s2), a1_scale=a1)
    assert_close_rms(got, want, *FP8_TOL)
    dyn = R.ref_fused_experts(x, q1, q2, wts, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2)
    assert not torch.equal(got, dyn)  # the static scale is really used


@pytest.mark.parametrize("on_input", [False, True])
@pytest.mark.parametrize("T,H,inter,E,block", [(3, 256, 128, 4, (128, 128)), (11, 96, 80, 8, (32, 64)),
                                                (1, 200, 136, 4, (128, 128))])
def test_fused_experts_fp8_block(on_input, T, H, inter, E, block):
    k = 1 if on_input else 2
    x, w1, w2, wts, ids = make_moe(T, H, inter, E, k, seed=9 + H)
    wts = sigmoid_weights(wts) if on_input else wts
    (q1, s1), (q2, s2) = R.ref_quantize_fp8(w1, "block", block=block), R.ref_quantize_fp8(w2, "block", block=block)
    got = R.ref_fused_experts(x, q1, q2, wts, ids, use_fp8_w8a8=True, block_shape=list(block), w1_scale=s1,
                              w2_scale=s2, apply_router_weight_on_input=on_input)
    want = oracle_fused_experts(x, q1, q2, wts, ids, on_input=on_input, scheme="fp8_block", scales=(s1, s2),
                                bn=block[0], bk=block[1])
    assert_close_rms(got, want, *FP8_TOL)
    # And the fp8 result stays near the unquantized one (fp8 e4m3 keeps 3 mantissa bits).
    bf16 = oracle_fused_experts(x, w1, w2, wts, ids, on_input=on_input)
    cos = torch.nn.functional.cosine_similarity(got.double().flatten(), bf16.flatten(), dim=0)
    assert cos > 0.99, float(cos)


def _moe_args():
    x, w1, w2, wts, ids = make_moe(4, 64, 32, 4, 2, seed=10)
    return dict(hidden_states=x, w1=w1, w2=w2, topk_weights=wts, topk_ids=ids)


@pytest.mark.parametrize("change,match", [
    (dict(hidden_states=torch.zeros(4, 64, dtype=torch.int32)), r"hidden_states: dtype .*torch.int32"),
    (dict(w1=torch.zeros(4, 60, 64, dtype=torch.bfloat16)), r"w1: shape must be \[4, 2\*I = 64 .*got \[4, 60, 64\]"),
    (dict(w2=torch.zeros(4, 32, 32, dtype=torch.bfloat16)), r"w2: shape must be \[4, 64, I\], got \[4, 32, 32\]"),
    (dict(w1=torch.zeros(4, 64, 64)), r"w1, w2: dtype must be torch.bfloat16, got torch.float32"),
    (dict(topk_ids=torch.zeros(4, 2)), r"topk_ids: dtype must be an integer type .*got torch.float32"),
    (dict(topk_weights=torch.zeros(4, 2, dtype=torch.int32)), r"topk_weights: dtype must be floating point"),
    (dict(topk_ids=torch.tensor([[0, 1]] * 3 + [[0, 4]], dtype=torch.int32)),
     r"topk_ids: values must be in \[-1, 4\), got \[4\]"),
    (dict(topk_weights=torch.zeros(4, 3)), r"topk_weights: shape must be \[4, 2\], got \[4, 3\]"),
    (dict(activation="relu"), r"activation: .*'relu'"),
    (dict(apply_router_weight_on_input=True), r"apply_router_weight_on_input: needs topk == 1, got topk 2"),
    (dict(w1_scale=torch.ones(4)), r"w1_scale: only used with use_fp8_w8a8=True"),
    (dict(expert_map=torch.tensor([0, 1, 2, 4], dtype=torch.int32)),
     r"expert_map: values must be in \[-1, 4\), got \[4\]"),
    (dict(global_num_experts=8), r"global_num_experts: must be -1 or E = 4"),
    (dict(out=torch.zeros(4, 64)), r"out: must be \[4, 64\] torch.bfloat16"),
])
def test_fused_experts_errors_leave_out_untouched(change, match):
    args = _moe_args()
    out = torch.full((4, 64), 7.0, dtype=torch.bfloat16)
    args.update({"out": out, **change})
    with pytest.raises(ValueError, match=match):
        R.ref_fused_experts(**args)
    assert torch.all(out == 7.0)


def test_fused_experts_fp8_scale_errors():
    a = _moe_args()
    (q1, s1), (q2, s2) = R.ref_quantize_fp8(a["w1"], "per_row"), R.ref_quantize_fp8(a["w2"], "per_row")
    base = dict(hidden_states=a["hidden_states"], w1=q1, w2=q2, topk_weights=a["topk_weights"],
                topk_ids=a["topk_ids"], use_fp8_w8a8=True)
    with pytest.raises(ValueError, match=r"w1_scale: required with use_fp8_w8a8"):
        R.ref_fused_experts(**base, w2_scale=s2)
    with pytest.raises(ValueError, match=r"w1_scale: per_channel_quant needs per-row scales \[4, 64\]"):
        R.ref_fused_experts(**base, per_channel_quant=True, w1_scale=torch.ones(4), w2_scale=s2)
    with pytest.raises(ValueError, match=r"w2_scale: shape must be .*got \[4, 3\]"):
        R.ref_fused_experts(**base, w1_scale=s1, w2_scale=torch.ones(4, 3))
    with pytest.raises(ValueError, match=r"w1_scale: block scales must have shape \[4, 1, 1\], got \[4, 64, 1\]"):
        R.ref_fused_experts(**base, block_shape=[128, 128], w1_scale=s1, w2_scale=s2)
