"""How moekit reads the arguments of vLLM 0.33's fused-MoE functions, without importing vLLM.

Shared by moekit.api and moekit.reference, so the op path and its pure-torch twin accept (and
refuse) exactly the same arguments:
  activation_name       the activation: a str, or any object with a str `.value` (vLLM's
                        MoEActivation members: SILU, GELU, GELU_TANH and their *_NO_MUL forms)
  quant_kwargs          a FusedMoEQuantConfig (duck-typed: any object with its attributes) ->
                        moekit's fp8 keywords (use_fp8_w8a8, per_channel_quant, block_shape, scales)
  check_weight_layout   the weight layouts fused_experts and prepack take
  check_indices_type    fused_topk's indices_type
  check_grouped_args    grouped_topk arguments a caller of the old (pre-0.33) order would misplace
Pure Python; every error is a ValueError naming the argument (quant_config fields as
`quant_config.<field>`). Tests: tests/python/test_api_vllm.py; docs: docs/python.md.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, Optional

import torch

# Weight layouts of fused_experts(weight_layout=...) and prepack(layout=...) (SPEC 4; the op's
# parse_layout): row_major as stored; cpu_vnni2_n32 the CPU VNNI-2 panels of pack_weight
# (moekit/ops/layout.h); shuffled_16x16 AITER's layout of shuffle_weight.
WEIGHT_LAYOUTS = ("row_major", "cpu_vnni2_n32", "shuffled_16x16")

# moekit's names and vLLM's MoEActivation values -> the name the op parses (fused_moe.h).
# "gelu" is the erf form in both; "gelu_pytorch_tanh" is MoEActivation.from_str's alias.
_ACTIVATIONS = {"silu": "silu", "swiglu": "silu", "gelu": "gelu", "gelu_erf": "gelu", "gelu_tanh": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh"}
_NO_MUL = "_no_mul"

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

# moekit's own fp8 keywords of fused_experts and their defaults (the "not given" values).
QUANT_KEYWORDS: Dict[str, Any] = dict(use_fp8_w8a8=False, per_channel_quant=False, block_shape=None, w1_scale=None,
                                      w2_scale=None, a1_scale=None)

# FusedMoEQuantConfig flags of schemes moekit does not run (checked first: reading a scale of an
# mxfp4 config asserts in vLLM, its scales are not tensors).
_UNSUPPORTED_FLAGS = ("use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "use_fp8_w8a16", "use_nvfp4_w4a16",
                      "use_mxfp4_w4a16", "use_mxfp4_w4a4", "use_nvfp4_w4a4", "use_mxfp4_w4a8")
# FusedMoEQuantConfig fields moekit has no use for: set (not None) -> ValueError, with the reason.
_UNSUPPORTED_FIELDS = (
    ("ocp_mx_scheme", "OCP MX (mxfp4 / mxfp6 / mxfp8) schemes are not supported"),
    ("a2_scale", "the intermediate activation is quantized dynamically (per token and slot, or per "
                 "1 x bk group); a static a2_scale is not supported"),
    ("w1_zp", "zero points (int4 / int8 weights) are not supported"),
    ("w2_zp", "zero points (int4 / int8 weights) are not supported"),
    ("w1_bias", "expert biases are not supported"),
    ("w2_bias", "expert biases are not supported"),
    ("a1_gscale", "global scales (nvfp4) are not supported"),
    ("a2_gscale", "global scales (nvfp4) are not supported"),
    ("g1_alphas", "alphas / global scales (nvfp4, W4A8) are not supported"),
    ("g2_alphas", "alphas / global scales (nvfp4, W4A8) are not supported"),
    ("gemm1_alpha", "a clamped or scaled SwiGLU (gemm1_alpha / beta / clamp_limit) is not supported"),
    ("gemm1_beta", "a clamped or scaled SwiGLU (gemm1_alpha / beta / clamp_limit) is not supported"),
    ("gemm1_clamp_limit", "a clamped or scaled SwiGLU (gemm1_alpha / beta / clamp_limit) is not supported"),
)
# What any quant_config must have (the rest is optional on a duck-typed object).
_REQUIRED = ("use_fp8_w8a8", "block_shape", "w1_scale", "w2_scale", "a1_scale")


def _fail(prefix: str, message: str) -> None:
    raise ValueError(f"{prefix}{message}")


def activation_name(activation: Any, w1: torch.Tensor, w2: torch.Tensor, prefix: str = "") -> str:
    """The op's activation name ("silu", "gelu", "gelu_tanh") for `activation`.

    `activation` is a str or any object whose `.value` is one (vLLM's MoEActivation). Gated names
    take w1 [E, 2I, H] (gate rows, then up rows): act(g) * u; moekit also reads w1 [E, I, H] with a
    gated name as its gate-only form act(w1 . x). vLLM's non-gated "<name>_no_mul" is that form
    and needs w1 [E, I, H] (I = w2.shape[2]).
    """
    value = getattr(activation, "value", activation)
    if not isinstance(value, str):
        _fail(prefix, f"activation: must be a str or a MoEActivation (an object with a str .value), got {activation!r}")
    base = value[:-len(_NO_MUL)] if value.endswith(_NO_MUL) else value
    name = _ACTIVATIONS.get(base)
    if name is None:
        _fail(prefix, "activation: must be silu, gelu or gelu_tanh (or their _no_mul forms: MoEActivation SILU, "
                      f"GELU, GELU_TANH, SILU_NO_MUL, ...), got {value!r}")
    if base != value and w1.dim() == 3 and w2.dim() == 3 and w1.shape[1] != w2.shape[2]:
        _fail(prefix, f"activation: {value!r} is not gated, so w1 must be [E, I = {w2.shape[2]}, H] (no up rows), "
                      f"got shape {list(w1.shape)}")
    return name


def check_weight_layout(layout: Any, name: str, prefix: str = "") -> str:
    if not isinstance(layout, str) or layout not in WEIGHT_LAYOUTS:
        _fail(prefix, f"{name}: must be one of {', '.join(WEIGHT_LAYOUTS)}, got {layout!r}")
    return layout


def token_expert_indices(T: int, k: int, device: Any) -> torch.Tensor:
    """fused_topk's third value: [T, k] int32, [t, j] = j * T + t, the row of (token t, slot j) in
    slot-major order (what vLLM's topk_softmax / topk_sigmoid kernels and moekit's topk_softmax op
    write)."""
    slots = torch.arange(k, dtype=torch.int32, device=device).unsqueeze(0) * T
    return slots + torch.arange(T, dtype=torch.int32, device=device).unsqueeze(1)


def check_indices_type(indices_type: Any, num_experts: int, prefix: str = "") -> None:
    """fused_topk's indices_type: None (int32) or an integer dtype that holds every expert id."""
    ok = (isinstance(indices_type, torch.dtype) and not indices_type.is_floating_point
          and not indices_type.is_complex and indices_type != torch.bool)
    if indices_type is None:
        return
    if not ok:
        _fail(prefix, f"indices_type: must be None (int32) or an integer dtype, got {indices_type}")
    top = torch.iinfo(indices_type).max
    if num_experts - 1 > top:
        _fail(prefix, f"indices_type: {indices_type} cannot hold expert ids up to {num_experts - 1} (max {top})")


def check_grouped_args(num_expert_group: Any, routed_scaling_factor: Any, e_score_correction_bias: Any,
                       prefix: str = "") -> None:
    """Types of the grouped_topk arguments that moved in vLLM 0.33's order (..., scoring_func,
    routed_scaling_factor, e_score_correction_bias), so a call in the old order fails here."""
    order = "(vLLM 0.33 order: ..., scoring_func, routed_scaling_factor, e_score_correction_bias)"
    if isinstance(routed_scaling_factor, (bool, torch.Tensor)) or not isinstance(routed_scaling_factor, numbers.Real):
        _fail(prefix, f"routed_scaling_factor: must be a float, got {type(routed_scaling_factor).__name__} {order}")
    if e_score_correction_bias is not None and not isinstance(e_score_correction_bias, torch.Tensor):
        _fail(prefix, f"e_score_correction_bias: must be a tensor [E] or None, got "
                      f"{type(e_score_correction_bias).__name__} {order}")
    if isinstance(num_expert_group, numbers.Integral) and num_expert_group < 1:
        _fail(prefix, f"num_expert_group: must be >= 1 and divide the expert count, got {num_expert_group} "
                      "(vLLM's default 0 means no groups; its router then calls fused_topk instead)")


def _given(value: Any) -> bool:
    return value is not None and value is not False


def quant_kwargs(quant_config: Any, keywords: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """moekit's fp8 keywords (QUANT_KEYWORDS) for a call: `keywords` as given when quant_config is
    None, else read from quant_config (vLLM's FusedMoEQuantConfig, or any object with its fields).

    Mapping: no quant_dtype (FUSED_MOE_UNQUANTIZED_CONFIG) -> unquantized (weights of x's dtype);
    fp8 W8A8 (use_fp8_w8a8, or quant_dtype an e4m3 dtype) with block_shape [bn, bk] -> the block
    scheme; fp8 W8A8 otherwise -> per-tensor ([E]) or per-channel ([E, N] / [E, N, 1]) weight scales
    as their shape says (per_out_ch_quant asks for the latter), activations quantized per token
    (also where vLLM would use one dynamic scale per tensor), or with the static a1_scale.
    Anything else set (int8 / int4 / fp4 / mx schemes, weight-only quantization, zero points,
    biases, a2_scale, global scales, SwiGLU limits) -> ValueError naming the field.
    """
    if quant_config is None:
        return dict(keywords)
    given = [n for n, v in keywords.items() if _given(v)]
    if given:
        _fail(prefix, f"quant_config: give the scheme either as quant_config or as the keywords "
                      f"{', '.join(QUANT_KEYWORDS)}, not both (got quant_config and {', '.join(given)})")
    qc = quant_config
    for flag in _UNSUPPORTED_FLAGS:
        if getattr(qc, flag, False):
            _fail(prefix, f"quant_config.{flag}: not supported by moekit (unquantized and fp8 W8A8 only)")
    if getattr(qc, "ocp_mx_scheme", None) is not None:
        _fail(prefix, f"quant_config.ocp_mx_scheme: {qc.ocp_mx_scheme!r}: OCP MX schemes are not supported")
    quant_dtype = getattr(qc, "quant_dtype", None)
    use_fp8 = bool(getattr(qc, "use_fp8_w8a8", False)) or quant_dtype in FP8_DTYPES
    if quant_dtype is not None and not use_fp8:
        _fail(prefix, f"quant_config.quant_dtype: {quant_dtype!r} is not supported (unquantized or fp8 e4m3 only)")
    weight_dtype = getattr(qc, "weight_quant_dtype", None)
    if weight_dtype is not None and not (use_fp8 and weight_dtype in FP8_DTYPES):
        what = "weight-only quantization" if not use_fp8 else "weights of another dtype than fp8"
        _fail(prefix, f"quant_config.weight_quant_dtype: {weight_dtype!r}: {what} is not supported")
    missing = [n for n in _REQUIRED if not hasattr(qc, n)]
    if missing:
        _fail(prefix, f"quant_config: must have the attributes of vLLM's FusedMoEQuantConfig; "
                      f"{type(qc).__name__} has no {', '.join(missing)}")
    for field, why in _UNSUPPORTED_FIELDS:
        if getattr(qc, field, None) is not None:
            _fail(prefix, f"quant_config.{field}: {why}")

    w1_scale, w2_scale, a1_scale = qc.w1_scale, qc.w2_scale, qc.a1_scale
    if not use_fp8:
        for name, v in (("w1_scale", w1_scale), ("w2_scale", w2_scale), ("a1_scale", a1_scale),
                        ("block_shape", qc.block_shape)):
            if v is not None:
                _fail(prefix, f"quant_config.{name}: set, but quant_config is unquantized (no fp8 quant_dtype)")
        return dict(QUANT_KEYWORDS)
    block: Optional[list] = None if qc.block_shape is None else list(qc.block_shape)
    per_channel = bool(getattr(qc, "per_out_ch_quant", False))
    if per_channel and block is None and (w1_scale is None or w1_scale.dim() < 2):
        _fail(prefix, "quant_config.per_out_ch_quant: needs per-channel w1_scale [E, N] or [E, N, 1], got "
                      f"{None if w1_scale is None else list(w1_scale.shape)}")
    return dict(use_fp8_w8a8=True, per_channel_quant=per_channel and block is None, block_shape=block,
                w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale)
