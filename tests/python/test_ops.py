"""Parity of the moekit Python API (through torch.ops.moekit) with its pure-torch reference
(moekit.reference, the ref_* twins) and with the C++ reference kernels forced by name; named edge
cases first (T = 0, k = 1, k = E, ties, NaN logits, -1 ids, expert_map, ragged fp8 blocks), then
random shapes over several seeds; errors (ValueError naming the argument, outputs untouched).
torch.library.opcheck, torch.compile and CUDA graphs: test_ops_torch.py. Run: pytest tests/python.
"""

from __future__ import annotations

import pytest
import torch

import moekit
from conftest import assert_close_lowp, assert_similar, moe_problem, randn, random_ids, requires_ops

pytestmark = requires_ops

FP8 = torch.float8_e4m3fn


# ------------------------------------------------------------------------------------ routing
@pytest.mark.parametrize("T,E,k,renorm", [(0, 8, 2, True), (1, 8, 1, False), (7, 8, 2, True), (5, 6, 6, False),
                                          (64, 128, 8, True), (3, 5, 3, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_topk_matches_reference(reference, device, T, E, k, renorm, dtype):
    g = randn((T, E), seed=T * 31 + E, dtype=dtype, device=device)
    x = torch.empty((T, 16), device=device)
    w, ids, tei = moekit.fused_topk(x, g, k, renorm)
    rw, rids, rtei = reference.ref_fused_topk(x.cpu(), g.cpu(), k, renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and list(ids.shape) == [T, k]
    assert torch.equal(ids.cpu(), rids) and torch.equal(tei.cpu(), rtei)
    torch.testing.assert_close(w.cpu(), rw, rtol=1e-6, atol=1e-7)


def test_fused_topk_ties_nan_and_inf(reference, device):
    g = torch.tensor([[1.0, 1.0, 1.0, 1.0],                      # ties -> lower ids
                      [float("nan")] * 4,                         # all NaN -> ids 0..k-1, weights 0
                      [0.0, float("inf"), float("nan"), float("inf")],  # +inf share the mass
                      [float("-inf"), 2.0, float("nan"), -1.0]], device=device)
    x = torch.empty((4, 8), device=device)
    for renorm in (False, True):
        w, ids, _ = moekit.fused_topk(x, g, 2, renorm)
        rw, rids, _ = reference.ref_fused_topk(x.cpu(), g.cpu(), 2, renorm)
        assert torch.equal(ids.cpu(), rids)
        torch.testing.assert_close(w.cpu(), rw, rtol=1e-6, atol=0)
    assert ids[0].tolist() == [0, 1] and ids[1].tolist() == [0, 1] and ids[2].tolist() == [1, 3]


@pytest.mark.parametrize("scoring,bias,renorm,rsf", [("softmax", False, False, 1.0), ("sigmoid", True, True, 2.5),
                                                     ("sigmoid", False, True, 1.0), ("softmax", True, False, 0.5)])
@pytest.mark.parametrize("T,E,k,groups,topk_group", [(0, 16, 4, 4, 2), (1, 16, 1, 4, 1), (9, 32, 8, 8, 4),
                                                      (33, 64, 6, 8, 3), (4, 12, 3, 3, 3)])
def test_grouped_topk_matches_reference(reference, device, scoring, bias, renorm, rsf, T, E, k, groups, topk_group):
    g = randn((T, E), seed=E + T, dtype=torch.bfloat16, device=device)
    b = randn((E,), seed=E, scale=0.1, device=device) if bias else None
    x = torch.empty((T, 8), device=device)
    w, ids = moekit.grouped_topk(x, g, k, renorm, groups, topk_group, scoring, rsf, b)
    rw, rids = reference.ref_grouped_topk(x.cpu(), g.cpu(), k, renorm, groups, topk_group, scoring, rsf,
                                          None if b is None else b.cpu())
    assert torch.equal(ids.cpu(), rids)
    torch.testing.assert_close(w.cpu(), rw, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("T,E,k", [(0, 16, 1), (1, 16, 1), (17, 128, 1), (8, 6, 3)])
def test_sigmoid_topk_matches_reference(reference, device, T, E, k):
    g = randn((T, E), seed=T + E, device=device)
    if T > 1:
        g[1, 2] = float("nan")
        g[1, 3] = g[1, 4] = 5.0  # tie -> lower id
    w, ids = moekit.sigmoid_topk(g, k)
    rw, rids = reference.ref_sigmoid_topk(g.cpu(), k)
    assert torch.equal(ids.cpu(), rids)
    torch.testing.assert_close(w.cpu(), rw, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op,args", [
    ("topk_softmax", ()), ("sigmoid_topk", ()), ("grouped_topk", ("sigmoid",))])
def test_routing_auto_kernel_matches_ref_kernel(op, args):
    """The kernel the registry picks on this machine (AVX-512 where present) == the C++ reference."""
    g = randn((37, 64), seed=5, dtype=torch.bfloat16)
    outs = []
    for kernel in (None, f"{op}_ref"):
        w = torch.empty((37, 4))
        ids = torch.empty((37, 4), dtype=torch.int32)
        if op == "topk_softmax":
            torch.ops.moekit.topk_softmax(w, ids, torch.empty_like(ids), g, True, kernel_name=kernel)
        elif op == "sigmoid_topk":
            torch.ops.moekit.sigmoid_topk(w, ids, g, kernel_name=kernel)
        else:
            torch.ops.moekit.grouped_topk(w, ids, g, randn((64,), 6, scale=0.1), 8, 4, *args, True, 2.5,
                                          kernel_name=kernel)
        outs.append((w, ids))
    assert torch.equal(outs[0][1], outs[1][1])
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------ sorting
def py_sort_tokens(ids: torch.Tensor, weights: torch.Tensor, E: int, block_m: int, encoding: str,
                   expert_map=None):
    """An independent, loop-by-loop formulation of SPEC 2 (moekit/ops/sorting.h)."""
    T, k = ids.shape
    runs = [[] for _ in range(E)]
    for t in range(T):
        for j in range(k):
            g = int(ids[t, j])
            local = g if expert_map is None or g < 0 else int(expert_map[g])
            if local >= 0:
                runs[local].append((t, j))
    pad = (k << 24) | T if encoding == "packed" else T * k
    token_ids, sorted_w, blocks = [], [], []
    for e, run in enumerate(runs):
        if not run:
            continue
        for t, j in run:
            token_ids.append((j << 24) | t if encoding == "packed" else t * k + j)
            sorted_w.append(float(weights[t, j]))
        while len(token_ids) % block_m:
            token_ids.append(pad)
            sorted_w.append(0.0)
        blocks += [e] * ((len(run) + block_m - 1) // block_m)
    return token_ids, sorted_w, blocks


@pytest.mark.parametrize("T,k,E,block_m,encoding", [(0, 2, 8, 4, "packed"), (1, 1, 8, 16, "flat"),
                                                     (13, 2, 8, 4, "packed"), (50, 4, 6, 8, "flat"),
                                                     (9, 3, 2, 1, "packed")])
def test_sort_tokens_matches_python(device, T, k, E, block_m, encoding):
    ids = random_ids(T, k, max(E, k), seed=T + k, device=device)
    ids = torch.where(ids >= E, torch.full_like(ids, -1), ids)  # ids beyond E -> "no expert"
    w = torch.rand((T, k)).to(device)
    s_ids, s_w, s_exp, n = moekit.sort_tokens(ids, w, E, block_m, encoding)
    want_ids, want_w, want_blocks = py_sort_tokens(ids.cpu(), w.cpu(), E, block_m, encoding)
    nv = int(n.item())
    assert nv == len(want_ids)
    assert s_ids[:nv].tolist() == want_ids
    assert s_w[:nv].cpu().tolist() == pytest.approx(want_w, abs=0)
    assert s_exp[: nv // block_m].tolist() == want_blocks
    assert bool((s_exp[nv // block_m:] == -1).all())
    assert len(s_ids) == moekit.sort_tokens_max_padded(T, k, E, block_m)


def test_sort_tokens_expert_map(device):
    ids = random_ids(20, 2, 8, seed=3, device=device)
    emap = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32, device=device)
    w = torch.rand((20, 2)).to(device)
    s_ids, _, s_exp, n = moekit.sort_tokens(ids, w, 4, 4, "flat", expert_map=emap)
    want_ids, _, want_blocks = py_sort_tokens(ids.cpu(), w.cpu(), 4, 4, "flat", emap.cpu())
    assert s_ids[: int(n.item())].tolist() == want_ids and s_exp[: len(want_blocks)].tolist() == want_blocks


# ------------------------------------------------------------------------------- quantization
@pytest.mark.parametrize("granularity,shape,kw", [
    ("per_tensor", (7, 64), {}), ("per_row", (5, 3, 40), {}), ("per_token_group", (9, 200), {"group": 128}),
    ("per_token_group", (4, 96), {"group": 32}), ("block", (2, 160, 200), {"block": (128, 128)}),
    ("block", (64, 64), {"block": (16, 32)}), ("per_row", (0, 16), {})])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_fp8_bit_exact(reference, device, granularity, shape, kw, dtype):
    x = randn(shape, seed=len(shape), dtype=dtype, device=device, scale=3.0)
    if x.numel():
        x.view(-1)[0] = 0.0
        if x.dim() >= 2:
            x[..., 1, :] = 0.0  # an all-zero row / group: floor scale, no 0/0
    q, s = moekit.quantize_fp8(x, granularity, **kw)
    rq, rs = reference.ref_quantize_fp8(x.cpu(), granularity, **kw)
    assert q.dtype == FP8 and list(s.shape) == list(rs.shape)
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8))


def test_quantize_fp8_static_and_fnuz(reference, device):
    x = randn((6, 48), seed=2, device=device, scale=4.0)
    scale = torch.tensor([0.02], device=device)
    q, s = moekit.quantize_fp8(x, "per_tensor", scale=scale)
    rq, _ = reference.ref_quantize_fp8(x.cpu(), "per_tensor", scale=scale.cpu())
    assert s is scale and torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8))
    qz, sz = moekit.quantize_fp8(x, "per_row", dtype=torch.float8_e4m3fnuz)
    rqz, rsz = reference.ref_quantize_fp8(x.cpu(), "per_row", dtype=torch.float8_e4m3fnuz)
    assert torch.equal(qz.cpu().view(torch.uint8), rqz.view(torch.uint8)) and torch.equal(sz.cpu(), rsz)


def test_convert_fp8_fnuz_to_fn_every_code(reference, device):
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fnuz).reshape(16, 16).to(device)
    scale = torch.rand(16, 1).to(device) + 0.5
    q, s = moekit.convert_fp8_fnuz_to_fn(codes, scale)
    rq, rs = reference.ref_convert_fp8_fnuz_to_fn(codes.cpu(), scale.cpu())
    assert q.dtype == FP8
    assert torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s.cpu(), rs)


# ------------------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("shape,dtype", [((32, 64), torch.bfloat16), ((3, 48, 96), FP8), ((2, 16, 32), torch.float32),
                                         ((0, 16, 32), torch.float16)])
def test_shuffle_weight_matches_reference_and_round_trips(reference, device, shape, dtype):
    if device == "cuda":
        pytest.skip("shuffle_weight has no CUDA kernel (weights are shuffled on the CPU at load time)")
    w = randn(shape, seed=7, device=device).to(dtype)
    sw = moekit.shuffle_weight(w)
    rsw = reference.ref_shuffle_weight(w.cpu())
    bits = torch.uint8 if dtype == FP8 else dtype
    assert torch.equal(sw.cpu().view(bits), rsw.view(bits))
    assert torch.equal(moekit.unshuffle_weight(sw).cpu().view(bits), w.cpu().view(bits))


# ----------------------------------------------------------------------------------- fused MoE
@pytest.mark.parametrize("T,H,I,E,k", [(0, 64, 32, 4, 2), (1, 64, 32, 8, 1), (5, 128, 64, 8, 2), (33, 96, 48, 6, 3),
                                       (64, 256, 128, 16, 8), (3, 64, 32, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_experts_unquantized(reference, device, T, H, I, E, k, dtype):
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed=T + H + E, dtype=dtype, device=device)
    y = moekit.fused_experts(x, w1, w2, w, ids)
    ry = reference.ref_fused_experts(x.cpu(), w1.cpu(), w2.cpu(), w.cpu(), ids.cpu())
    assert y.dtype == dtype and y.shape == x.shape
    assert_close_lowp(y, ry)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("gate_only", [False, True])
def test_fused_experts_activations_and_gate_only(reference, activation, gate_only):
    x, w1, w2, w, ids = moe_problem(9, 64, 32, 4, 2, seed=11, gate_only=gate_only)
    y = moekit.fused_experts(x, w1, w2, w, ids, activation=activation)
    assert_close_lowp(y, reference.ref_fused_experts(x, w1, w2, w, ids, activation=activation))


def test_fused_experts_f32_matches_reference(reference):
    x, w1, w2, w, ids = moe_problem(6, 64, 32, 4, 2, seed=3, dtype=torch.float32)
    y = moekit.fused_experts(x, w1, w2, w, ids)
    torch.testing.assert_close(y, reference.ref_fused_experts(x, w1, w2, w, ids), rtol=1e-4, atol=1e-5)


def test_fused_experts_expert_map_and_minus_one_ids(reference, device):
    """Expert parallelism: 8 global experts, 4 local; ids of remote experts and -1 contribute nothing;
    a token whose experts are all remote gets a zero row."""
    x, _, _, w, ids = moe_problem(12, 64, 32, 8, 2, seed=21, device=device)
    _, w1, w2, _, _ = moe_problem(1, 64, 32, 4, 1, seed=22, device=device)
    emap = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32, device=device)
    ids[0] = torch.tensor([0, 2], dtype=torch.int32)   # both remote -> zero row
    ids[1, 1] = -1
    y = moekit.fused_experts(x, w1, w2, w, ids, expert_map=emap, global_num_experts=8)
    ry = reference.ref_fused_experts(x.cpu(), w1.cpu(), w2.cpu(), w.cpu(), ids.cpu(), expert_map=emap.cpu(),
                                     global_num_experts=8)
    assert_close_lowp(y, ry)
    assert bool((y[0] == 0).all())


def test_fused_experts_router_weight_on_input(reference, device):
    x, w1, w2, w, ids = moe_problem(10, 64, 32, 4, 1, seed=8, device=device)
    y = moekit.fused_experts(x, w1, w2, w, ids, apply_router_weight_on_input=True)
    ry = reference.ref_fused_experts(x.cpu(), w1.cpu(), w2.cpu(), w.cpu(), ids.cpu(),
                                     apply_router_weight_on_input=True)
    assert_close_lowp(y, ry)


def quantized_problem(T, H, I, E, k, seed, granularity, block=(128, 128), device="cpu"):
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed, dtype=torch.bfloat16, device=device)
    if granularity == "block":
        q1, s1 = moekit.quantize_fp8(w1.float(), "block", block=block)
        q2, s2 = moekit.quantize_fp8(w2.float(), "block", block=block)
    elif granularity == "per_row":
        q1, s1 = moekit.quantize_fp8(w1.float(), "per_row")
        q2, s2 = moekit.quantize_fp8(w2.float(), "per_row")
    else:  # one scale per expert: [E]
        q1, q2 = torch.empty_like(w1, dtype=FP8), torch.empty_like(w2, dtype=FP8)
        s1, s2 = torch.empty(E, device=device), torch.empty(E, device=device)
        for e in range(E):
            q1[e], s1[e:e + 1] = moekit.quantize_fp8(w1[e].float(), "per_tensor")
            q2[e], s2[e:e + 1] = moekit.quantize_fp8(w2[e].float(), "per_tensor")
    return x, q1, q2, s1, s2, w, ids


@pytest.mark.parametrize("granularity,tkw1,static", [("per_row", False, False), ("per_tensor", False, False),
                                                     ("per_row", True, False), ("per_tensor", False, True)])
@pytest.mark.parametrize("T", [0, 1, 19])
def test_fused_experts_fp8_row(reference, device, granularity, tkw1, static, T):
    k = 1 if tkw1 else 2
    x, q1, q2, s1, s2, w, ids = quantized_problem(T, 128, 64, 4, k, seed=T + 40, granularity=granularity,
                                                  device=device)
    a1 = torch.tensor([0.01], device=device) if static else None
    kw = dict(use_fp8_w8a8=True, per_channel_quant=granularity == "per_row", w1_scale=s1, w2_scale=s2,
              a1_scale=a1, apply_router_weight_on_input=tkw1)
    y = moekit.fused_experts(x, q1, q2, w, ids, **kw)
    cpu_kw = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
    ry = reference.ref_fused_experts(x.cpu(), q1.cpu(), q2.cpu(), w.cpu(), ids.cpu(), **cpu_kw)
    assert_similar(y, ry)


@pytest.mark.parametrize("H,I,block", [(256, 128, (128, 128)), (160, 96, (128, 128)), (64, 64, (32, 32))])
@pytest.mark.parametrize("tkw1", [False, True])
def test_fused_experts_fp8_block(reference, H, I, block, tkw1):
    k = 1 if tkw1 else 3
    x, q1, q2, s1, s2, w, ids = quantized_problem(21, H, I, 6, k, seed=H + I, granularity="block", block=block)
    kw = dict(use_fp8_w8a8=True, block_shape=list(block), w1_scale=s1, w2_scale=s2,
              apply_router_weight_on_input=tkw1)
    assert_similar(moekit.fused_experts(x, q1, q2, w, ids, **kw),
                   reference.ref_fused_experts(x, q1, q2, w, ids, **kw))


@pytest.mark.parametrize("seed", range(4))
def test_fused_moe_auto_kernel_matches_ref_kernel(seed):
    """Random shapes: the kernel picked on this machine vs fused_moe_ref (bf16)."""
    g = torch.Generator().manual_seed(seed)
    T, E = int(torch.randint(1, 80, (1,), generator=g)), int(torch.randint(2, 12, (1,), generator=g))
    H, I = 32 * int(torch.randint(1, 6, (1,), generator=g)), 32 * int(torch.randint(1, 5, (1,), generator=g))
    k = int(torch.randint(1, E + 1, (1,), generator=g))
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed=seed + 100)
    out_auto, out_ref = torch.empty_like(x), torch.empty_like(x)
    torch.ops.moekit.fused_moe(out_auto, x, w1, w2, w, ids)
    torch.ops.moekit.fused_moe(out_ref, x, w1, w2, w, ids, kernel_name="fused_moe_ref")
    assert_close_lowp(out_auto, out_ref)


@pytest.mark.parametrize("T", [1, 64])
def test_fused_experts_kernel_names_the_kernel_that_runs(device, T):
    """fused_experts_kernel: a kernel that, named explicitly, gives fused_experts' output; same
    checks as fused_experts, nothing written."""
    x, w1, w2, w, ids = moe_problem(T, 64, 32, 4, 2, seed=T, device=device)
    name = moekit.fused_experts_kernel(x, w1, w2, w, ids)
    assert isinstance(name, str) and name.startswith("fused_moe")
    named = torch.empty_like(x)
    torch.ops.moekit.fused_moe(named, x, w1, w2, w, ids, kernel_name=name)
    assert torch.equal(named, moekit.fused_experts(x, w1, w2, w, ids))
    out = torch.full_like(x, 7.0)
    assert moekit.fused_experts_kernel(x, w1, w2, w, ids, out=out) == name
    assert bool((out == 7.0).all())
    with pytest.raises(ValueError, match="fused_moe_kernel: topk_weights: shape must be"):
        moekit.fused_experts_kernel(x, w1, w2, w[:, :1], ids)


def test_fused_experts_out_argument_and_shuffled_weights():
    x, w1, w2, w, ids = moe_problem(8, 64, 32, 4, 2, seed=9)
    out = torch.full_like(x, 7.0)
    y = moekit.fused_experts(x, w1, w2, w, ids, out=out)
    assert y is out
    shuffled = torch.empty_like(x)
    torch.ops.moekit.fused_moe(shuffled, x, moekit.shuffle_weight(w1), moekit.shuffle_weight(w2), w, ids,
                               weight_layout="shuffled_16x16")
    assert_close_lowp(shuffled, y)


def test_aiter_names_match_fused_moe():
    x, w1, w2, w, ids = moe_problem(8, 128, 64, 4, 2, seed=12)
    want = moekit.fused_experts(x, w1, w2, w, ids)
    got = torch.empty_like(x)
    torch.ops.moekit.ck_moe(got, x, w1, w2, w, ids)
    assert torch.equal(got, want)
    x, q1, q2, s1, s2, w, ids = quantized_problem(8, 128, 64, 4, 2, seed=13, granularity="per_row")
    want = moekit.fused_experts(x, q1, q2, w, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2)
    torch.ops.moekit.asm_moe(got, x, q1, q2, w, ids, s1, s2)
    assert torch.equal(got, want)
    x, q1, q2, s1, s2, w, ids = quantized_problem(8, 128, 64, 4, 1, seed=14, granularity="per_row")
    want = moekit.fused_experts(x, q1, q2, w, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
                                apply_router_weight_on_input=True)
    torch.ops.moekit.asm_moe_tkw1(got, x, q1, q2, w, ids, s1, s2)
    assert torch.equal(got, want)
    x, q1, q2, s1, s2, w, ids = quantized_problem(8, 128, 128, 4, 2, seed=15, granularity="block")
    want = moekit.fused_experts(x, q1, q2, w, ids, use_fp8_w8a8=True, block_shape=[128, 128], w1_scale=s1,
                                w2_scale=s2)
    torch.ops.moekit.fmoe_fp8_blockscale_g1u1(got, x, q1, q2, w, ids, s1, s2)
    assert torch.equal(got, want)


def test_fused_experts_config(device):
    """config= (docs/fused_moe_configs.md): a malformed name is a ValueError on any device; on the CPU
    no kernel takes configs, so a well-formed one is refused (NotImplementedError naming the config);
    on CUDA the named config runs and gives the kernel's own result (small_m, then the grouped tile
    the rules pick), and fused_experts_kernel names the row that ran it."""
    x, w1, w2, w, ids = moe_problem(8, 256, 128, 4, 2, seed=3, device=device)
    with pytest.raises(ValueError, match="mainloop must be mma, ws or ring"):
        moekit.fused_experts(x, w1, w2, w, ids, config="grouped/64x256.wgmma4")
    if device == "cpu":
        with pytest.raises(NotImplementedError, match="config 'small_m'"):
            moekit.fused_experts(x, w1, w2, w, ids, config="small_m")
        return
    base = moekit.fused_experts(x, w1, w2, w, ids)
    assert moekit.fused_experts_kernel(x, w1, w2, w, ids, config="small_m") == "fused_moe_sm90_bf16"
    for cfg in ("small_m", "grouped/64x256.mma4"):
        got = moekit.fused_experts(x, w1, w2, w, ids, config=cfg)
        assert (got.float() - base.float()).abs().max() <= 0.02 * base.float().abs().max(), cfg


# -------------------------------------------------------------------------------------- errors
def test_errors_name_the_argument_and_leave_outputs_untouched():
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = torch.empty_like(x).view(torch.uint8).fill_(0xAB).view(x.dtype)
    before = out.clone()
    with pytest.raises(ValueError, match=r"moekit.fused_moe: topk_weights: shape must be \[4, 2\], got \[4, 3\]"):
        torch.ops.moekit.fused_moe(out, x, w1, w2, torch.rand(4, 3), ids)
    bad = ids.clone()
    bad[3, 1] = 9  # out of range: found by the scan before any write
    with pytest.raises(ValueError, match="topk_ids"):
        moekit.fused_experts(x, w1, w2, w, bad, out=out)
    with pytest.raises(ValueError, match="activation"):
        moekit.fused_experts(x, w1, w2, w, ids, activation="relu", out=out)
    with pytest.raises(ValueError, match="hidden_states: dtype"):
        moekit.fused_experts(x.double(), w1, w2, w, ids, out=out)
    assert torch.equal(out.view(torch.uint8), before.view(torch.uint8))
    with pytest.raises(ValueError, match="use_fp8_w8a8"):
        moekit.fused_experts(x, w1, w2, w, ids, use_fp8_w8a8=True)
    with pytest.raises(ValueError, match="kernel"):
        torch.ops.moekit.fused_moe(out, x, w1, w2, w, ids, kernel_name="no_such_kernel")
    with pytest.raises(ValueError, match="topk"):
        moekit.fused_topk(x, randn((4, 4), 0), 5, False)
    with pytest.raises(ValueError, match="n_group|num_expert_group"):
        moekit.grouped_topk(x, randn((4, 6), 0), 2, False, 4, 2)
    with pytest.raises(ValueError, match="layout"):
        moekit.shuffle_weight(w1, layout=(32, 32))
    with pytest.raises(ValueError, match="granularity"):
        moekit.quantize_fp8(x, "per_column")
