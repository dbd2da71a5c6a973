"""moekit's Python API against vLLM 0.33's fused-MoE functions (issue 30, item 3): the signatures of
fused_topk, grouped_topk and fused_experts (written down below as data, from vLLM 0.33's source),
their return values against pure-torch computations, fused_experts with a duck-typed
FusedMoEQuantConfig (bf16, fp8 per-tensor, per-channel, 128 x 128 blocks) and vLLM's MoEActivation,
the errors for what moekit does not run, and prepack / weight_layout (the packed CPU path).
vLLM itself is not needed (its enum and config are stood in for by objects with the same values
and attributes); where vLLM is importable, the data is also checked against its real signatures.
Run: pytest tests/python/test_api_vllm.py.
"""

from __future__ import annotations

import enum
import inspect
from types import SimpleNamespace

import pytest
import torch

import moekit
from conftest import assert_close_lowp, assert_similar, moe_problem, randn, requires_ops

pytestmark = requires_ops

FP8 = torch.float8_e4m3fn
REQUIRED = inspect.Parameter.empty

# vLLM 0.33: vllm/model_executor/layers/fused_moe/router/fused_topk_router.py,
# router/grouped_topk_router.py and fused_moe.py. (name, default) in order, all positional-or-
# keyword. fused_experts' activation default is MoEActivation.SILU there, whose .value is "silu".
VLLM_0_33 = {
    "fused_topk": [("hidden_states", REQUIRED), ("gating_output", REQUIRED), ("topk", REQUIRED),
                   ("renormalize", REQUIRED), ("indices_type", None), ("scoring_func", "softmax")],
    "grouped_topk": [("hidden_states", REQUIRED), ("gating_output", REQUIRED), ("topk", REQUIRED),
                     ("renormalize", REQUIRED), ("num_expert_group", 0), ("topk_group", 0),
                     ("scoring_func", "softmax"), ("routed_scaling_factor", 1.0), ("e_score_correction_bias", None)],
    "fused_experts": [("hidden_states", REQUIRED), ("w1", REQUIRED), ("w2", REQUIRED), ("topk_weights", REQUIRED),
                      ("topk_ids", REQUIRED), ("activation", "silu"), ("apply_router_weight_on_input", False),
                      ("global_num_experts", -1), ("expert_map", None), ("quant_config", None)],
}
VLLM_MODULES = {"fused_topk": "vllm.model_executor.layers.fused_moe.router.fused_topk_router",
                "grouped_topk": "vllm.model_executor.layers.fused_moe.router.grouped_topk_router",
                "fused_experts": "vllm.model_executor.layers.fused_moe.fused_moe"}
# moekit's keyword-only extras of fused_experts (the vLLM plugin passes the fp8 ones).
FUSED_EXPERTS_EXTRAS = ["use_fp8_w8a8", "per_channel_quant", "block_shape", "w1_scale", "w2_scale", "a1_scale",
                        "weight_layout", "out"]


class MoEActivation(enum.Enum):
    """Stand-in for vLLM 0.33's MoEActivation (fused_moe/activation.py): the same values."""
    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    GELU_TANH_NO_MUL = "gelu_tanh_no_mul"


def quant_config(quant_dtype=None, per_act_token_quant=False, per_out_ch_quant=False, block_shape=None,
                 w1_scale=None, w2_scale=None, a1_scale=None, **fields):
    """An object with the attributes fused_experts reads from vLLM's FusedMoEQuantConfig, derived as
    its properties derive them (use_fp8_w8a8 = quant_dtype is fp8, ...); `fields` override."""
    attrs = dict(quant_dtype=quant_dtype, weight_quant_dtype=quant_dtype, use_fp8_w8a8=quant_dtype == FP8,
                 use_int8_w8a8=quant_dtype == torch.int8, use_int8_w8a16=False, use_int4_w4a16=False,
                 use_fp8_w8a16=False, use_nvfp4_w4a16=False, use_mxfp4_w4a16=False, use_mxfp4_w4a4=False,
                 use_nvfp4_w4a4=False, use_mxfp4_w4a8=False, ocp_mx_scheme=None,
                 per_act_token_quant=per_act_token_quant, per_out_ch_quant=per_out_ch_quant,
                 block_shape=block_shape, w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=None,
                 w1_zp=None, w2_zp=None, w1_bias=None, w2_bias=None, a1_gscale=None, a2_gscale=None,
                 g1_alphas=None, g2_alphas=None, gemm1_alpha=None, gemm1_beta=None, gemm1_clamp_limit=None,
                 is_scale_swizzled=True, is_scale_transposed=False)
    attrs.update(fields)
    return SimpleNamespace(**attrs)


def poisoned_out(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x).view(torch.uint8).fill_(0xAB).view(x.dtype)


def params(fn):
    return list(inspect.signature(fn).parameters.values())


# ---------------------------------------------------------------------------------- signatures
@pytest.mark.parametrize("name", sorted(VLLM_0_33))
def test_signatures_are_vllm_0_33(reference, name):
    want = VLLM_0_33[name]
    for fn in (getattr(moekit, name), getattr(reference, f"ref_{name}")):
        ps = params(fn)
        got = [(p.name, p.default) for p in ps[:len(want)]]
        assert got == want, f"{fn.__module__}.{fn.__name__}"
        assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in ps[:len(want)])
        extras = ps[len(want):]
        assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in extras), f"{fn.__name__}: extras keyword-only"
        if name == "fused_experts":
            assert [p.name for p in extras][:len(FUSED_EXPERTS_EXTRAS)] == FUSED_EXPERTS_EXTRAS
        else:
            assert extras == []


@pytest.mark.parametrize("name", sorted(VLLM_0_33))
def test_signature_data_matches_installed_vllm(name):
    """Where vLLM is installed (its own venv), the data above is vLLM's real signature."""
    vllm = pytest.importorskip("vllm")
    if not vllm.__version__.startswith("0.33"):
        pytest.skip(f"pinned vLLM is 0.33, found {vllm.__version__}")
    import importlib

    fn = getattr(importlib.import_module(VLLM_MODULES[name]), name)
    got = [(p.name, getattr(p.default, "value", p.default)) for p in params(fn)]
    assert got == VLLM_0_33[name]


# --------------------------------------------------------------------------------- fused_topk
def torch_fused_topk(g: torch.Tensor, k: int, renormalize: bool, scoring_func: str):
    """vLLM's fused_topk in plain torch (distinct logits: no ties to break)."""
    scores = torch.softmax(g.float(), dim=-1) if scoring_func == "softmax" else torch.sigmoid(g.float())
    w, ids = torch.topk(scores, k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    T = g.shape[0]
    tei = torch.arange(k).unsqueeze(0) * T + torch.arange(T).unsqueeze(1)
    return w, ids.to(torch.int32), tei.to(torch.int32)


@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid"])
@pytest.mark.parametrize("T,E,k,renorm", [(0, 8, 2, True), (1, 8, 1, False), (9, 16, 4, True), (33, 64, 8, False),
                                          (5, 6, 6, True)])
def test_fused_topk_three_values_match_torch(reference, device, scoring_func, T, E, k, renorm):
    g = randn((T, E), seed=T * 7 + E, device=device)
    x = torch.empty((T, 16), device=device)
    want_w, want_ids, want_tei = torch_fused_topk(g.cpu(), k, renorm, scoring_func)
    for fn in (moekit.fused_topk, reference.ref_fused_topk):
        gg, xx = (g, x) if fn is moekit.fused_topk else (g.cpu(), x.cpu())
        w, ids, tei = fn(xx, gg, k, renorm, None, scoring_func)
        assert w.dtype == torch.float32 and ids.dtype == torch.int32 and tei.dtype == torch.int32
        assert torch.equal(ids.cpu(), want_ids) and torch.equal(tei.cpu(), want_tei)
        torch.testing.assert_close(w.cpu(), want_w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("indices_type", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_fused_topk_indices_type(reference, indices_type):
    g = randn((7, 32), seed=1)
    for fn in (moekit.fused_topk, reference.ref_fused_topk):
        want = fn(g, g, 3, True)
        w, ids, tei = fn(g, g, 3, True, indices_type)
        assert ids.dtype == indices_type and tei.dtype == torch.int32
        assert torch.equal(ids.long(), want[1].long()) and torch.equal(w, want[0]) and torch.equal(tei, want[2])


def test_fused_topk_sigmoid_edge_rows(reference):
    """NaN logits rank last (sigmoid 0), ties go to the lower id, an all -inf row keeps weights 0."""
    g = torch.tensor([[0.5, float("nan"), 0.5, -1.0], [float("-inf")] * 4, [3.0, 1.0, float("nan"), 2.0]])
    for renorm in (False, True):
        w, ids, _ = moekit.fused_topk(g, g, 2, renorm, scoring_func="sigmoid")
        rw, rids, _ = reference.ref_fused_topk(g, g, 2, renorm, scoring_func="sigmoid")
        assert torch.equal(ids, rids) and ids.tolist() == [[0, 2], [0, 1], [0, 3]]
        torch.testing.assert_close(w, rw, rtol=1e-6, atol=0)
        assert w[1].tolist() == [0.0, 0.0]
    assert torch.allclose(w[0], torch.tensor([0.5, 0.5])) and torch.allclose(w.sum(-1)[[0, 2]], torch.ones(2))


def test_fused_topk_sigmoid_compiles_fullgraph():
    g = randn((9, 16), seed=3)

    def route(g):
        return moekit.fused_topk(g, g, 3, True, torch.int64, "sigmoid")

    torch._dynamo.reset()
    for a, b in zip(torch.compile(route, fullgraph=True)(g), route(g)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scoring_func="relu"), r"scoring_func: must be 'softmax' or 'sigmoid', got 'relu'"),
    (dict(indices_type=torch.float32), r"indices_type: must be None \(int32\) or an integer dtype, got torch.float32"),
    (dict(indices_type=torch.bool), r"indices_type: .*got torch.bool"),
])
def test_fused_topk_errors(reference, kwargs, match):
    g = randn((4, 8), seed=0)
    for fn in (moekit.fused_topk, reference.ref_fused_topk):
        with pytest.raises(ValueError, match=match):
            fn(g, g, 2, True, **kwargs)


def test_fused_topk_indices_type_too_narrow(reference):
    g = randn((2, 300), seed=0)
    for fn in (moekit.fused_topk, reference.ref_fused_topk):
        with pytest.raises(ValueError, match=r"indices_type: torch.uint8 cannot hold expert ids up to 299 \(max 255\)"):
            fn(g, g, 2, True, torch.uint8)


# ------------------------------------------------------------------------------- grouped_topk
def test_grouped_topk_vllm_argument_order(reference, device):
    """Positional in vLLM 0.33's order == keywords; routed_scaling_factor applied once (weights of a
    renormalized row sum to it, as vLLM's grouped_topk returns them)."""
    g = randn((11, 32), seed=4, device=device)
    bias = randn((32,), seed=5, scale=0.1, device=device)
    x = torch.empty((11, 8), device=device)
    kw = moekit.grouped_topk(hidden_states=x, gating_output=g, topk=4, renormalize=True, num_expert_group=8,
                             topk_group=2, scoring_func="sigmoid", routed_scaling_factor=2.5,
                             e_score_correction_bias=bias)
    pos = moekit.grouped_topk(x, g, 4, True, 8, 2, "sigmoid", 2.5, bias)
    ref = reference.ref_grouped_topk(x.cpu(), g.cpu(), 4, True, 8, 2, "sigmoid", 2.5, bias.cpu())
    assert torch.equal(kw[0], pos[0]) and torch.equal(kw[1], pos[1])
    assert torch.equal(pos[1].cpu(), ref[1])
    torch.testing.assert_close(pos[0].cpu(), ref[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(pos[0].sum(-1).cpu(), torch.full((11,), 2.5), rtol=1e-6, atol=1e-6)


def test_grouped_topk_old_order_and_unset_groups_are_errors(reference):
    g = randn((4, 16), seed=6)
    bias = randn((16,), seed=7, scale=0.1)
    for fn in (moekit.grouped_topk, reference.ref_grouped_topk):
        # The pre-0.33 moekit order (..., scoring_func, e_score_correction_bias, routed_scaling_factor).
        with pytest.raises(ValueError, match=r"routed_scaling_factor: must be a float, got Tensor \(vLLM 0.33 order"):
            fn(g, g, 2, True, 4, 2, "sigmoid", bias, 2.5)
        with pytest.raises(ValueError, match=r"e_score_correction_bias: must be a tensor \[E\] or None, got float"):
            fn(g, g, 2, True, 4, 2, "sigmoid", 2.5, 1.0)
        with pytest.raises(ValueError, match=r"num_expert_group: must be >= 1 .* got 0 \(vLLM's default 0 means no"):
            fn(g, g, 2, True)


# ----------------------------------------------------------------- fused_experts: quant_config
def fp8_problem(T, H, I, E, k, seed, scheme):
    """bf16 problem with fp8 weights: scheme per_tensor ([E] scales), per_channel ([E, N, 1]) or block."""
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed)
    if scheme == "block":
        q1, s1 = moekit.quantize_fp8(w1.float(), "block", block=(128, 128))
        q2, s2 = moekit.quantize_fp8(w2.float(), "block", block=(128, 128))
    elif scheme == "per_channel":
        q1, s1 = moekit.quantize_fp8(w1.float(), "per_row")
        q2, s2 = moekit.quantize_fp8(w2.float(), "per_row")
    else:
        q1, q2 = torch.empty_like(w1, dtype=FP8), torch.empty_like(w2, dtype=FP8)
        s1, s2 = torch.empty(E), torch.empty(E)
        for e in range(E):
            q1[e], s1[e:e + 1] = moekit.quantize_fp8(w1[e].float(), "per_tensor")
            q2[e], s2[e:e + 1] = moekit.quantize_fp8(w2[e].float(), "per_tensor")
    return x, q1, q2, s1, s2, w, ids


# (scheme, quant_config fields, moekit's equivalent keywords)
FP8_CASES = {
    "per_tensor": (dict(), dict()),
    "per_tensor_static_a1": (dict(a1_scale="a1"), dict(a1_scale="a1")),
    "per_channel": (dict(per_act_token_quant=True, per_out_ch_quant=True), dict(per_channel_quant=True)),
    "block": (dict(block_shape=[128, 128]), dict(block_shape=[128, 128])),
}


@pytest.mark.parametrize("case", sorted(FP8_CASES))
@pytest.mark.parametrize("T", [0, 1, 13])
def test_fused_experts_fp8_quant_config(reference, case, T):
    scheme = case.replace("_static_a1", "")
    x, q1, q2, s1, s2, w, ids = fp8_problem(T, 256, 128, 4, 2, seed=T + len(case), scheme=scheme)
    a1 = torch.tensor([0.02])
    qc_fields, kw_fields = ({n: a1 if v == "a1" else v for n, v in d.items()} for d in FP8_CASES[case])
    qc = quant_config(FP8, w1_scale=s1, w2_scale=s2, **qc_fields)
    got = moekit.fused_experts(x, q1, q2, w, ids, quant_config=qc)
    want = moekit.fused_experts(x, q1, q2, w, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2, **kw_fields)
    assert torch.equal(got, want)  # the same op call
    # The positional form of vLLM's call: activation, apply_router_weight_on_input, global_num_experts,
    # expert_map, quant_config.
    assert torch.equal(moekit.fused_experts(x, q1, q2, w, ids, MoEActivation.SILU, False, -1, None, qc), want)
    assert_similar(got, reference.ref_fused_experts(x, q1, q2, w, ids, quant_config=qc))


def test_fused_experts_unquantized_quant_config_and_activation_enum(reference):
    x, w1, w2, w, ids = moe_problem(9, 64, 32, 4, 2, seed=2)
    plain = moekit.fused_experts(x, w1, w2, w, ids)
    unquantized = quant_config()  # vLLM's FUSED_MOE_UNQUANTIZED_CONFIG: nothing set
    assert torch.equal(moekit.fused_experts(x, w1, w2, w, ids, quant_config=unquantized), plain)
    assert torch.equal(moekit.fused_experts(x, w1, w2, w, ids, MoEActivation.SILU, False, -1, None, unquantized),
                       plain)
    assert_close_lowp(plain, reference.ref_fused_experts(x, w1, w2, w, ids, MoEActivation.SILU,
                                                         quant_config=unquantized))
    for act in (MoEActivation.GELU, MoEActivation.GELU_TANH):
        assert torch.equal(moekit.fused_experts(x, w1, w2, w, ids, act),
                           moekit.fused_experts(x, w1, w2, w, ids, activation=act.value))


def test_fused_experts_no_mul_activation_is_the_gate_only_form(reference):
    x, w1, w2, w, ids = moe_problem(9, 64, 32, 4, 2, seed=3, gate_only=True)
    for act in (MoEActivation.SILU_NO_MUL, MoEActivation.GELU_NO_MUL, MoEActivation.GELU_TANH_NO_MUL):
        base = act.value.replace("_no_mul", "")
        got = moekit.fused_experts(x, w1, w2, w, ids, act)
        assert torch.equal(got, moekit.fused_experts(x, w1, w2, w, ids, activation=base))
        assert_close_lowp(got, reference.ref_fused_experts(x, w1, w2, w, ids, act))


def test_fused_experts_minimal_duck_typed_quant_config():
    """Only the attributes every config must have: use_fp8_w8a8, block_shape and the three scales."""
    x, q1, q2, s1, s2, w, ids = fp8_problem(5, 256, 128, 4, 2, seed=8, scheme="block")
    qc = SimpleNamespace(use_fp8_w8a8=True, block_shape=[128, 128], w1_scale=s1, w2_scale=s2, a1_scale=None)
    assert torch.equal(moekit.fused_experts(x, q1, q2, w, ids, quant_config=qc),
                       moekit.fused_experts(x, q1, q2, w, ids, use_fp8_w8a8=True, block_shape=[128, 128],
                                            w1_scale=s1, w2_scale=s2))


# Each: (quant_config fields, the field the message must name). Data: fp8 per-tensor weights.
UNSUPPORTED = [
    (dict(quant_dtype=torch.int8), "use_int8_w8a8"),
    (dict(use_int8_w8a16=True, quant_dtype=None, weight_quant_dtype=torch.int8), "use_int8_w8a16"),
    (dict(use_int4_w4a16=True, quant_dtype=None, weight_quant_dtype="int4"), "use_int4_w4a16"),
    (dict(use_fp8_w8a16=True, quant_dtype=None), "use_fp8_w8a16"),
    (dict(use_mxfp4_w4a16=True, quant_dtype=None, weight_quant_dtype="mxfp4"), "use_mxfp4_w4a16"),
    (dict(use_mxfp4_w4a4=True, quant_dtype="mxfp4", use_fp8_w8a8=False), "use_mxfp4_w4a4"),
    (dict(use_nvfp4_w4a4=True, quant_dtype="nvfp4", use_fp8_w8a8=False), "use_nvfp4_w4a4"),
    (dict(use_nvfp4_w4a16=True, quant_dtype=None, weight_quant_dtype="nvfp4"), "use_nvfp4_w4a16"),
    (dict(use_mxfp4_w4a8=True, quant_dtype="fp8", use_fp8_w8a8=False), "use_mxfp4_w4a8"),
    (dict(ocp_mx_scheme="w_mxfp6_e3m2_a_mxfp6_e3m2"), "ocp_mx_scheme"),
    (dict(quant_dtype="mxfp8", use_fp8_w8a8=False), "quant_dtype"),
    (dict(weight_quant_dtype="int4"), "weight_quant_dtype"),
    (dict(a2_scale=torch.tensor([0.05])), "a2_scale"),
    (dict(w1_zp=torch.zeros(4)), "w1_zp"),
    (dict(w2_zp=torch.zeros(4)), "w2_zp"),
    (dict(w1_bias=torch.zeros(4, 256)), "w1_bias"),
    (dict(w2_bias=torch.zeros(4, 256)), "w2_bias"),
    (dict(a1_gscale=torch.ones(1)), "a1_gscale"),
    (dict(g1_alphas=torch.ones(4)), "g1_alphas"),
    (dict(g2_alphas=torch.ones(4)), "g2_alphas"),
    (dict(gemm1_alpha=1.702), "gemm1_alpha"),
    (dict(gemm1_clamp_limit=7.0), "gemm1_clamp_limit"),
    (dict(per_out_ch_quant=True), "per_out_ch_quant"),  # with [E] (per-tensor) scales
]


@pytest.mark.parametrize("fields,field", UNSUPPORTED, ids=[f for _, f in UNSUPPORTED])
def test_fused_experts_unsupported_quant_config_fields(reference, fields, field):
    x, q1, q2, s1, s2, w, ids = fp8_problem(4, 256, 128, 4, 2, seed=9, scheme="per_tensor")
    fields = dict(fields)
    qc = quant_config(fields.pop("quant_dtype", FP8), w1_scale=s1, w2_scale=s2, **fields)
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=rf"^moekit: quant_config\.{field}: "):
        moekit.fused_experts(x, q1, q2, w, ids, quant_config=qc, out=out)
    assert bool((out.view(torch.uint8) == 0xAB).all()), "out was written by a call that failed"
    with pytest.raises(ValueError, match=rf"^quant_config\.{field}: "):
        reference.ref_fused_experts(x, q1, q2, w, ids, quant_config=qc)


def test_fused_experts_quant_config_misuse(reference):
    x, q1, q2, s1, s2, w, ids = fp8_problem(4, 256, 128, 4, 2, seed=10, scheme="per_tensor")
    qc = quant_config(FP8, w1_scale=s1, w2_scale=s2)
    for fn in (moekit.fused_experts, reference.ref_fused_experts):
        with pytest.raises(ValueError, match=r"quant_config: give the scheme either as quant_config or as the "
                                             r"keywords .* not both \(got quant_config and use_fp8_w8a8, w1_scale\)"):
            fn(x, q1, q2, w, ids, quant_config=qc, use_fp8_w8a8=True, w1_scale=s1)
        with pytest.raises(ValueError, match=r"quant_config: must have the attributes of vLLM's FusedMoEQuantConfig; "
                                             r"SimpleNamespace has no block_shape, a1_scale"):
            fn(x, q1, q2, w, ids, quant_config=SimpleNamespace(use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2))
        with pytest.raises(ValueError, match=r"quant_config.w1_scale: set, but quant_config is unquantized"):
            fn(x, q1.bfloat16(), q2.bfloat16(), w, ids, quant_config=quant_config(w1_scale=s1))
        with pytest.raises(ValueError, match=r"use_fp8_w8a8=False does not match the weights|w1, w2: dtype"):
            fn(x, q1, q2, w, ids, quant_config=quant_config())  # fp8 weights, unquantized config


@pytest.mark.parametrize("activation,match", [
    (MoEActivation.RELU2, r"activation: must be silu, gelu or gelu_tanh .*got 'relu2'"),
    (MoEActivation.SWIGLUOAI, r"activation: must be silu, gelu or gelu_tanh .*got 'swigluoai'"),
    (MoEActivation.SILU_NO_MUL, r"activation: 'silu_no_mul' is not gated, so w1 must be \[E, I = 32, H\]"),
    (3, r"activation: must be a str or a MoEActivation"),
])
def test_fused_experts_activation_errors(reference, activation, match):
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=match):
        moekit.fused_experts(x, w1, w2, w, ids, activation, out=out)
    assert bool((out.view(torch.uint8) == 0xAB).all())
    with pytest.raises(ValueError, match=match):
        reference.ref_fused_experts(x, w1, w2, w, ids, activation)


# ------------------------------------------------------------------- prepack and weight_layout
@pytest.mark.parametrize("shape", [(64, 32), (3, 32, 96), (2, 2, 64, 16), (0, 32, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, FP8])
def test_prepack_matches_reference_and_round_trips(reference, shape, dtype):
    w = randn(shape, seed=len(shape)).to(dtype)
    bits = torch.uint8 if dtype == FP8 else torch.int16
    packed = moekit.prepack(w)
    assert packed.shape == w.shape and packed.dtype == w.dtype and packed.is_contiguous()
    assert torch.equal(packed.view(bits), reference.ref_prepack(w).view(bits))
    assert torch.equal(moekit.unprepack(packed).view(bits), w.view(bits))
    assert torch.equal(reference.ref_unprepack(packed).view(bits), w.view(bits))
    if w.numel():  # the closed form of moekit/ops/layout.h: dst(n, c) = ((n/32 * K/2 + c/2) * 32 + n%32) * 2 + c%2
        N, K = shape[-2], shape[-1]
        n, c = N - 1, K - 3
        flat = packed.reshape(-1, N * K)[0].view(bits)
        dst = ((n // 32 * (K // 2) + c // 2) * 32 + n % 32) * 2 + c % 2
        assert flat[dst] == w.reshape(-1, N, K)[0, n, c].view(bits)


def test_prepack_other_layouts_and_errors(reference):
    w = randn((2, 32, 64), seed=3).bfloat16()
    assert torch.equal(moekit.prepack(w, "shuffled_16x16"), moekit.shuffle_weight(w))
    assert torch.equal(moekit.unprepack(moekit.prepack(w, "shuffled_16x16"), "shuffled_16x16"), w)
    assert moekit.prepack(w, "row_major") is w  # already contiguous
    assert torch.equal(moekit.prepack(w.transpose(1, 2).contiguous().transpose(1, 2)), moekit.prepack(w))
    for fn in (moekit.prepack, reference.ref_prepack):
        with pytest.raises(ValueError, match=r"layout: must be one of row_major, cpu_vnni2_n32, shuffled_16x16, "
                                             r"got 'vnni'"):
            fn(w, "vnni")
        with pytest.raises(ValueError, match=r"needs N % 32 == 0 and K % 2 == 0, got \[N, K\] = \[48, 64\]"):
            fn(randn((48, 64), seed=0).bfloat16())
        with pytest.raises(ValueError, match=r"bf16|f16|fp8"):
            fn(randn((32, 64), seed=0))  # f32 has no packed layout


@pytest.mark.parametrize("scheme", ["bf16", "f16", "per_tensor", "per_channel", "block"])
def test_fused_experts_packed_weights_match_row_major(reference, scheme):
    """prepack + weight_layout="cpu_vnni2_n32" == row_major weights (the fast path needs AVX-512
    BF16; elsewhere the portable kernels read the packed weights element by element)."""
    if scheme in ("bf16", "f16"):
        dtype = torch.bfloat16 if scheme == "bf16" else torch.float16
        x, w1, w2, w, ids = moe_problem(19, 256, 128, 4, 2, seed=12, dtype=dtype)
        kw = {}
    else:
        x, w1, w2, s1, s2, w, ids = fp8_problem(19, 256, 128, 4, 2, seed=13, scheme=scheme)
        kw = dict(quant_config=quant_config(FP8, w1_scale=s1, w2_scale=s2,
                                            block_shape=[128, 128] if scheme == "block" else None))
    p1, p2 = moekit.prepack(w1), moekit.prepack(w2)
    row = moekit.fused_experts(x, w1, w2, w, ids, **kw)
    packed = moekit.fused_experts(x, p1, p2, w, ids, **kw, weight_layout="cpu_vnni2_n32")
    ref_packed = reference.ref_fused_experts(x, p1, p2, w, ids, **kw, weight_layout="cpu_vnni2_n32")
    assert torch.equal(ref_packed, reference.ref_fused_experts(x, w1, w2, w, ids, **kw))  # unpacked exactly
    if scheme in ("bf16", "f16"):
        assert_close_lowp(packed, row)
        assert_close_lowp(packed, ref_packed)
    else:
        assert_similar(packed, row, min_cos=0.9999, max_rms_ratio=0.01)
        assert_similar(packed, ref_packed)


def test_fused_experts_weight_layout_errors(reference):
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=r"weight_layout: must be one of row_major, cpu_vnni2_n32, shuffled_16x16, "
                                         r"got 'packed'"):
        moekit.fused_experts(x, w1, w2, w, ids, weight_layout="packed", out=out)
    x, w1, w2, w, ids = moe_problem(4, 48, 32, 4, 2, seed=1)  # w2 [E, H = 48, I]: N % 32 != 0
    with pytest.raises(ValueError, match=r"w2: layout cpu_vnni2_n32 needs N % 32 == 0"):
        moekit.fused_experts(x, w1, w2, w, ids, weight_layout="cpu_vnni2_n32")
    with pytest.raises(ValueError, match=r"w2: layout cpu_vnni2_n32 needs N % 32 == 0"):
        reference.ref_fused_experts(x, w1, w2, w, ids, weight_layout="cpu_vnni2_n32")
    x32, w132, w232, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"w1: layout cpu_vnni2_n32 needs bf16, f16 or fp8"):
        moekit.fused_experts(x32, w132, w232, w, ids, weight_layout="cpu_vnni2_n32")
    with pytest.raises(ValueError, match=r"w1: layout cpu_vnni2_n32 needs bf16, f16 or fp8"):
        reference.ref_fused_experts(x32, w132, w232, w, ids, weight_layout="cpu_vnni2_n32")
