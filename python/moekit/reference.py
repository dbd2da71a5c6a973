"""Pure-torch reference of the moekit Python API (SPEC 1, 3, 4, 5 of docs/spec.md), the spec in readable code.

Every public function of moekit.api has a twin here, same signature, prefixed ``ref_``:
  ref_fused_topk, ref_grouped_topk, ref_sigmoid_topk     routing (SPEC 1.1-1.3)
  ref_fused_experts                                      fused MoE, every scheme (SPEC 3.1-3.5)
  ref_quantize_fp8, ref_convert_fp8_fnuz_to_fn           quantization helpers (SPEC 5)
  ref_shuffle_weight, ref_unshuffle_weight               AITER (16, 16) layout (SPEC 4)
  ref_prepack, ref_unprepack                             weight layouts for fused_experts (SPEC 4)
fused_topk, grouped_topk and fused_experts have the signatures of vLLM 0.33's functions; the
arguments they share with vLLM (activation, quant_config, weight_layout) are read by
moekit._vllm_args, the same code the op path uses.
moekit.api runs these instead of torch.ops.moekit.* when MOEKIT_USE_FUSED_MOE=0, and the op tests
(tests/python/test_ops.py) compare the ops with them. They follow the C++ reference kernels
(src/ops/*/*_ref.cpp) rule for rule: f32 math, the same non-finite rules, the same fp8 rounding
(scale = max(amax, 1e-12) / fp8_max, q = fp8(x / scale) rounded to nearest even, saturated), and
sums over k (and over the experts of a softmax) taken in index order. Only the dot products use
torch's matmul, whose summation order differs from the scalar C++ loops (f32 rounding level).
Tests: tests/python/test_reference.py (against independently written float64 formulations and
tests/data/dtype_golden.json).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import _vllm_args

# amax floor of every dynamic fp8 scale: an all-zero group gets scale 1e-12 / fp8_max, not 0
# (moekit/ops/quant.h kFp8AmaxFloor).
FP8_AMAX_FLOOR = 1e-12
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}
GRANULARITIES = ("per_tensor", "per_row", "per_token_group", "block")

_NEG_INF = float("-inf")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _shape(t: torch.Tensor) -> list:
    return list(t.shape)


# ---------------------------------------------------------------- small numeric helpers
def _ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim, element 0 first, as the scalar C++ loops do."""
    # NOTE: on the CPU torch.cumsum is a sequential scan, so its last element is the in-order sum
    # bit for bit (x.sum() may use a vectorized tree). On other devices it is the same sum up to
    # f32 rounding.
    if x.shape[-1] == 0:
        return x.sum(-1)
    return torch.cumsum(x, dim=-1)[..., -1]


def _clean_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits as f32 with NaN mapped to -inf (SPEC 1.1: a NaN logit counts as -inf)."""
    x = logits.float()
    return torch.where(torch.isnan(x), torch.full_like(x, _NEG_INF), x)


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Row softmax in f32 with moekit's non-finite rules (src/ref/ref_topk.h).

    NaN counts as -inf; +inf logits share the whole mass equally (every other entry 0); a row with
    no logit above -inf has no softmax and is all 0. Otherwise exp(x - max) / sum, summed in order.
    """
    x = _clean_logits(logits)
    mx = x.amax(dim=-1, keepdim=True)
    finite_max = torch.isfinite(mx)
    e = torch.exp(torch.where(finite_max, x - mx, torch.zeros_like(x)))
    p = e / _ordered_sum(e).unsqueeze(-1)
    is_pos_inf = (x == float("inf")).float()
    p_inf = is_pos_inf / is_pos_inf.sum(dim=-1, keepdim=True).clamp_min(1.0)
    p = torch.where(finite_max, p, torch.where(mx > 0, p_inf, torch.zeros_like(x)))
    return p


def _sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """sigmoid in f32; NaN -> 0 (the value of sigmoid(-inf))."""
    return torch.sigmoid(_clean_logits(logits))


def _topk_desc(score: torch.Tensor, k: int, eligible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Indices of the k largest scores per row, descending, ties to the LOWER index, NaN as -inf.

    With `eligible` (bool, same shape) every eligible entry ranks above every ineligible one,
    whatever the scores (grouped_topk: experts of dropped groups).
    """
    key = torch.where(torch.isnan(score), torch.full_like(score, _NEG_INF), score)
    # A stable descending sort keeps equal scores in index order: ties go to the lower index.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    if eligible is not None:
        # Second stable sort on the primary key (eligible first) keeps the score order inside it.
        rank = torch.sort(eligible.gather(-1, order).to(torch.uint8), dim=-1, descending=True, stable=True).indices
        order = order.gather(-1, rank)
    return order[..., :k]


def _renormalize(w: torch.Tensor) -> torch.Tensor:
    """w / sum(w) per row, in-order sum; rows whose sum is not > 0 are left as they are."""
    s = _ordered_sum(w).unsqueeze(-1)
    return torch.where(s > 0, w / s, w)


def _check_gating(gating_output: torch.Tensor, hidden_states: Optional[torch.Tensor]) -> None:
    _require(gating_output.dim() == 2, f"gating_output: must be 2-D [T, E], got shape {_shape(gating_output)}")
    _require(gating_output.dtype in (torch.float32, torch.bfloat16, torch.float16),
             f"gating_output: dtype must be float32, bfloat16 or float16, got {gating_output.dtype}")
    if hidden_states is not None:
        _require(hidden_states.dim() == 2 and hidden_states.shape[0] == gating_output.shape[0],
                 f"hidden_states: must be [T, H] with T = {gating_output.shape[0]} (gating_output rows), "
                 f"got shape {_shape(hidden_states)}")


def _check_topk(topk: int, num_experts: int, name: str = "topk") -> None:
    _require(1 <= topk <= num_experts, f"{name}: must be in [1, {num_experts}], got {topk}")


# ---------------------------------------------------------------- routing (SPEC 1)
def ref_fused_topk(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                   indices_type: Optional[torch.dtype] = None, scoring_func: str = "softmax"
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing (SPEC 1.1; Mixtral, Qwen3-MoE), vLLM 0.33's fused_topk: (weights f32 [T, k],
    ids [T, k] int32 (or indices_type), token_expert_indices int32 [T, k], [t, j] = j * T + t).

    softmax: ids = top-k of softmax(logits), weights = those probabilities. sigmoid: ids = top-k of
    the logits (ref_sigmoid_topk), weights = sigmoid(logit). Either renormalized to sum 1 if asked.
    """
    _check_gating(gating_output, hidden_states)
    _check_topk(topk, gating_output.shape[1])
    _vllm_args.check_indices_type(indices_type, gating_output.shape[1])
    _require(scoring_func in ("softmax", "sigmoid"),
             f"scoring_func: must be 'softmax' or 'sigmoid', got {scoring_func!r}")
    if scoring_func == "softmax":
        p = _softmax(gating_output)
        ids = _topk_desc(p, topk).to(torch.int32)
        w = p.gather(1, ids.long())
    else:
        w, ids = ref_sigmoid_topk(gating_output, topk)
    if renormalize:
        w = _renormalize(w)
    T = gating_output.shape[0]
    return w, ids.to(indices_type or torch.int32), _vllm_args.token_expert_indices(T, topk, gating_output.device)


def ref_grouped_topk(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                     num_expert_group: int = 0, topk_group: int = 0, scoring_func: str = "softmax",
                     routed_scaling_factor: float = 1.0, e_score_correction_bias: Optional[torch.Tensor] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k (SPEC 1.2; DeepSeek-V2/V3), vLLM 0.33's grouped_topk: (weights f32 [T, k], ids
    int32 [T, k]).

    s = scoring(logits); b = s + bias (selection only); group score = sum of the top-2 b of the group
    with a bias, its max without; the topk_group best groups stay; ids = top-k of b among them;
    weights = s[ids], renormalized if asked, then times routed_scaling_factor (its only place).
    num_expert_group must divide E (vLLM's default 0, no groups, is refused).
    """
    _vllm_args.check_grouped_args(num_expert_group, routed_scaling_factor, e_score_correction_bias)
    _check_gating(gating_output, hidden_states)
    T, E = gating_output.shape
    _require(num_expert_group >= 1 and E % num_expert_group == 0,
             f"num_expert_group: must divide the expert count {E}, got {num_expert_group}")
    _require(1 <= topk_group <= num_expert_group,
             f"topk_group: must be in [1, num_expert_group = {num_expert_group}], got {topk_group}")
    group_size = E // num_expert_group
    _check_topk(topk, topk_group * group_size, "topk (<= topk_group * experts per group)")
    _require(scoring_func in ("softmax", "sigmoid"),
             f"scoring_func: must be 'softmax' or 'sigmoid', got {scoring_func!r}")
    bias = e_score_correction_bias
    if bias is not None:
        _require(bias.dim() == 1 and bias.shape[0] == E,
                 f"e_score_correction_bias: shape must be [{E}], got {_shape(bias)}")

    s = _softmax(gating_output) if scoring_func == "softmax" else _sigmoid(gating_output)
    b = _clean_logits(s + bias.float()) if bias is not None else s
    grouped = b.view(T, num_expert_group, group_size)
    if bias is not None:
        top2 = torch.sort(grouped, dim=-1, descending=True).values[..., : min(2, group_size)]
        group_score = _ordered_sum(top2)
    else:
        group_score = grouped.amax(dim=-1)
    kept = _topk_desc(group_score, topk_group)
    group_kept = torch.zeros(T, num_expert_group, dtype=torch.bool, device=b.device).scatter_(1, kept, True)
    eligible = group_kept.repeat_interleave(group_size, dim=1)
    b = b.masked_fill(~eligible, _NEG_INF)
    ids = _topk_desc(b, topk, eligible)
    w = s.gather(1, ids)
    if renormalize:
        w = _renormalize(w)
    return w * routed_scaling_factor, ids.to(torch.int32)


def ref_sigmoid_topk(gating_output: torch.Tensor, topk: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid top-k (SPEC 1.3; Llama-4): ids = top-k RAW logits, weight = sigmoid(logit), no renorm."""
    _check_gating(gating_output, None)
    _check_topk(topk, gating_output.shape[1])
    logits = _clean_logits(gating_output)
    ids = _topk_desc(logits, topk)
    return _sigmoid(logits.gather(1, ids)), ids.to(torch.int32)


# ---------------------------------------------------------------- fp8 helpers (SPEC 5)
def ref_cast_fp8(v: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """f32 values -> fp8 codes: saturate to +-fp8_max, then round to nearest even (torch's cast).

    NaN stays NaN (the format's NaN code). Checked bit for bit against tests/data/dtype_golden.json.
    """
    fmax = FP8_MAX[dtype]
    return v.float().clamp(-fmax, fmax).to(dtype)


def _dynamic_scale(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    return amax.clamp_min(FP8_AMAX_FLOOR) / fp8_max


def _quant_act_rows(v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dynamic e4m3fn quant of each row of f32 v, as fused_moe quantizes activations (SPEC 3.2).

    Returns the fp8 code VALUES as f32 (same shape as v) and the scales [rows, 1]. amax skips NaN
    (C++ fmax) but not inf.
    """
    a = v.abs()
    amax = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=-1, keepdim=True)
    s = _dynamic_scale(amax, FP8_MAX[torch.float8_e4m3fn])
    return ref_cast_fp8(v / s).float(), s


def _quant_act_groups(v: torch.Tensor, bk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """As _quant_act_rows per 1 x bk group (the last one may be narrower): values, scales [rows, G]."""
    parts = [_quant_act_rows(v[:, c0:c0 + bk]) for c0 in range(0, v.shape[1], bk)]
    return torch.cat([q for q, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1)


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def ref_quantize_fp8(x: torch.Tensor, granularity: str = "per_tensor", group: int = 128,
                     block: Sequence[int] = (128, 128), dtype: torch.dtype = torch.float8_e4m3fn,
                     scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp8 quantization (SPEC 5, moekit/ops/quant.h): returns (q of `dtype`, f32 scales).

    Scale shapes (leading dims of x kept): per_tensor [1]; per_row [..., 1] (per-channel weights,
    per-token activations); per_token_group [..., ceil(K / group)]; block [..., ceil(N / bn),
    ceil(K / bk)] with (bn, bk) = block. Per group: amax over its FINITE elements, scale =
    max(amax, 1e-12) / fp8_max, q = fp8(x / scale). Ragged last groups get their own scale.
    `scale` (per_tensor only) is a static scale: q = fp8(x / scale), which must be finite and > 0.
    """
    _require(granularity in GRANULARITIES, f"granularity: must be one of {GRANULARITIES}, got {granularity!r}")
    _require(dtype in FP8_MAX, f"dtype: must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {dtype}")
    _require(x.dtype in (torch.float32, torch.bfloat16, torch.float16),
             f"x: dtype must be float32, bfloat16 or float16, got {x.dtype}")
    _require(group >= 1, f"group: must be >= 1, got {group}")
    _require(len(block) == 2 and min(block) >= 1, f"block: must be two sizes >= 1, got {tuple(block)}")
    need_dims = 2 if granularity == "block" else (1 if granularity != "per_tensor" else 0)
    _require(x.dim() >= need_dims, f"x: {granularity} needs at least {need_dims} dims, got shape {_shape(x)}")
    fp8_max = FP8_MAX[dtype]
    xf = x.float()

    if scale is not None:
        _require(granularity == "per_tensor",
                 f"scale: a static scale needs granularity 'per_tensor', got {granularity!r}")
        _require(scale.numel() == 1, f"scale: static scale must have 1 element, got shape {_shape(scale)}")
        s = float(scale.reshape(-1)[0])
        _require(s > 0 and s != float("inf"), f"scale: static per-tensor scale must be finite and > 0, got {s}")
        return ref_cast_fp8(xf / scale.float().reshape(1), dtype), scale

    # Every granularity is a (bn x bk) tiling of x seen as [B, R, C] (quantize_fp8_ref.cpp).
    K = x.shape[-1] if x.dim() >= 1 else 1
    if granularity == "per_tensor":
        B, R, C, bn, bk, lead = 1, 1, max(x.numel(), 1), 1, max(x.numel(), 1), []
    elif granularity in ("per_row", "per_token_group"):
        bk = K if granularity == "per_row" else group
        B, R, C, bn, lead = 1, x.numel() // max(K, 1), K, 1, list(x.shape[:-1])
    else:
        N, bk = x.shape[-2], block[1]
        B, R, C, bn, lead = x.numel() // max(N * K, 1), N, K, block[0], list(x.shape[:-2])
    RB, CB = _ceil_div(R, bn), _ceil_div(C, bk)
    if granularity == "per_tensor":
        scale_shape = [1]
    elif granularity == "per_row":
        scale_shape = lead + [1]
    elif granularity == "per_token_group":
        scale_shape = lead + [CB]
    else:
        scale_shape = lead + [RB, CB]
    if x.numel() == 0:  # nothing to quantize: empty codes, scales as for an all-zero input
        return torch.empty_like(x, dtype=dtype), torch.full(scale_shape, FP8_AMAX_FLOOR / fp8_max, device=x.device)

    x3 = xf.reshape(B, R, C)
    finite_abs = torch.where(torch.isfinite(x3), x3.abs(), torch.zeros_like(x3))
    padded = F.pad(finite_abs, (0, CB * bk - C, 0, RB * bn - R))  # zeros never raise an amax
    amax = padded.view(B, RB, bn, CB, bk).amax(dim=(2, 4))
    s = _dynamic_scale(amax, fp8_max)  # [B, RB, CB]
    s_full = s.repeat_interleave(bn, dim=1)[:, :R].repeat_interleave(bk, dim=2)[:, :, :C]
    q = ref_cast_fp8(x3 / s_full, dtype).reshape(x.shape)
    return q, s.reshape(scale_shape)


def ref_convert_fp8_fnuz_to_fn(q: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz checkpoint -> e4m3fn (SPEC 5): same bits mean twice the value, so scales x 0.5.

    The bits are kept except fnuz NaN (0x80) -> 0x00 and +-240 (0x7F / 0xFF, NaN in fn) -> +-448
    (0x7E / 0xFE). decode(out) * scale_out == decode(q) * scale for every other code.
    """
    _require(q.dtype == torch.float8_e4m3fnuz, f"q: dtype must be torch.float8_e4m3fnuz, got {q.dtype}")
    _require(scale.dtype == torch.float32, f"scale: dtype must be float32, got {scale.dtype}")
    bits = q.view(torch.uint8)
    out = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    out = torch.where((bits & 0x7F) == 0x7F, (bits & 0x80) | 0x7E, out)
    return out.view(torch.float8_e4m3fn), scale * 0.5


# ---------------------------------------------------------------- weight layout (SPEC 4)
def _shuffle_dims(w: torch.Tensor, layout: Sequence[int], name: str):
    _require(tuple(layout) == (16, 16), f"layout: only (16, 16) is supported, got {tuple(layout)}")
    _require(2 <= w.dim() <= 4, f"{name}: must have 2-4 dims [..., N, K], got shape {_shape(w)}")
    _require(w.element_size() in (1, 2, 4), f"{name}: element size must be 1, 2 or 4 bytes, got {w.dtype}")
    N, K = w.shape[-2], w.shape[-1]
    _require(N % 16 == 0, f"{name}: N (dim -2) must be a multiple of 16, got {N}")
    _require(K % 32 == 0, f"{name}: K (dim -1) must be a multiple of 32, got {K}")
    V = 16 // w.element_size()
    return list(w.shape[:-2]), N, K, V


def ref_shuffle_weight(w: torch.Tensor, layout: Sequence[int] = (16, 16)) -> torch.Tensor:
    """AITER (16, 16) layout: each [N, K] as [N/16, 16, K/32, 32/V, V] -> [N/16, K/32, 32/V, 16, V].

    V = 16 bytes / element size; same shape and dtype, contiguous. Closed form (SPEC 4):
    dst(n, c) = (((n/16 * K/32 + c/32) * (32/V) + (c%32)/V) * 16 + n%16) * V + c%V.
    """
    lead, N, K, V = _shuffle_dims(w, layout, "w")
    d = len(lead)
    tiles = w.reshape(*lead, N // 16, 16, K // 32, 32 // V, V)
    perm = list(range(d)) + [d, d + 2, d + 3, d + 1, d + 4]
    return tiles.permute(*perm).contiguous().view(w.shape)


def ref_unshuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """Exact inverse of ref_shuffle_weight."""
    return _unprepack(w, "shuffled_16x16", "w")


VNNI_PANEL_N, VNNI_PAIR_K = 32, 2  # cpu_vnni2_n32 (moekit/ops/layout.h kVnniPanelN, kVnniPairK)


def _vnni_dims(w: torch.Tensor, name: str):
    _require(2 <= w.dim() <= 4, f"{name}: must have 2-4 dims [..., N, K], got shape {_shape(w)}")
    _require(w.dtype in (torch.bfloat16, torch.float16) + _vllm_args.FP8_DTYPES,
             f"{name}: layout cpu_vnni2_n32 needs bf16, f16 or fp8 e4m3 elements, got {w.dtype}")
    N, K = w.shape[-2], w.shape[-1]
    _require(N % VNNI_PANEL_N == 0 and K % VNNI_PAIR_K == 0,
             f"{name}: layout cpu_vnni2_n32 needs N % 32 == 0 and K % 2 == 0, got [N, K] = [{N}, {K}]")
    return list(w.shape[:-2]), N, K


def ref_prepack(w: torch.Tensor, layout: str = "cpu_vnni2_n32") -> torch.Tensor:
    """w [..., N, K] in `layout` (same shape and dtype, contiguous). cpu_vnni2_n32: each [N, K] as
    [N/32, 32, K/2, 2] -> [N/32, K/2, 32, 2], i.e. dst(n, c) = ((n/32 * K/2 + c/2) * 32 + n%32) * 2
    + c%2; shuffled_16x16: ref_shuffle_weight; row_major: w made contiguous."""
    _vllm_args.check_weight_layout(layout, "layout")
    if layout == "row_major":
        return w.contiguous()
    if layout == "shuffled_16x16":
        return ref_shuffle_weight(w)
    lead, N, K = _vnni_dims(w, "w")
    d = len(lead)
    panels = w.reshape(*lead, N // VNNI_PANEL_N, VNNI_PANEL_N, K // VNNI_PAIR_K, VNNI_PAIR_K)
    perm = list(range(d)) + [d, d + 2, d + 1, d + 3]
    return panels.permute(*perm).contiguous().view(w.shape)


def ref_unprepack(w: torch.Tensor, layout: str = "cpu_vnni2_n32") -> torch.Tensor:
    """Exact inverse of ref_prepack(w, layout): the row_major weights."""
    _vllm_args.check_weight_layout(layout, "layout")
    return _unprepack(w, layout, "w")


def _unprepack(w: torch.Tensor, layout: str, name: str) -> torch.Tensor:
    if layout == "row_major":
        return w.contiguous()
    if layout == "shuffled_16x16":
        lead, N, K, V = _shuffle_dims(w, (16, 16), name)
        d = len(lead)
        tiles = w.reshape(*lead, N // 16, K // 32, 32 // V, 16, V)
        return tiles.permute(*(list(range(d)) + [d, d + 3, d + 1, d + 2, d + 4])).contiguous().view(w.shape)
    lead, N, K = _vnni_dims(w, name)
    d = len(lead)
    panels = w.reshape(*lead, N // VNNI_PANEL_N, K // VNNI_PAIR_K, VNNI_PANEL_N, VNNI_PAIR_K)
    perm = list(range(d)) + [d, d + 2, d + 1, d + 3]
    return panels.permute(*perm).contiguous().view(w.shape)



# ---------------------------------------------------------------- fused experts (SPEC 3)
def _activation(z: torch.Tensor, act: str) -> torch.Tensor:
    """act(z) in f32, the formulas of fused_moe_ref.h."""
    if act == "silu":
        return z / (1.0 + torch.exp(-z))
    if act == "gelu":  # erf form
        return 0.5 * z * (1.0 + torch.erf(z * 0.70710678118654752))
    c = 0.79788456080286536  # sqrt(2 / pi)
    return 0.5 * z * (1.0 + torch.tanh(c * (z + 0.044715 * z * z * z)))


def _act_and_mul(h: torch.Tensor, act: str, inter: int) -> torch.Tensor:
    """g1u1 (h = [g | u], 2I columns): act(g) * u; g1u0 (I columns): act(h)."""
    if h.shape[1] == 2 * inter:
        return _activation(h[:, :inter], act) * h[:, inter:]
    return _activation(h, act)


def _row_scales(scale: Optional[torch.Tensor], E: int, N: int, per_channel: bool, name: str) -> torch.Tensor:
    """Per-row weight scales as [E, N]: [E] per-tensor (broadcast) or [E, N] / [E, N, 1] per-row."""
    _require(scale is not None, f"{name}: required with use_fp8_w8a8")
    _require(scale.dtype == torch.float32, f"{name}: dtype must be float32, got {scale.dtype}")
    if _shape(scale) == [E]:
        _require(not per_channel, f"{name}: per_channel_quant needs per-row scales [{E}, {N}] or "
                                  f"[{E}, {N}, 1], got [{E}]")
        return scale.float().view(E, 1).expand(E, N)
    _require(_shape(scale) in ([E, N], [E, N, 1]),
             f"{name}: shape must be [{E}] (per-tensor), [{E}, {N}] or [{E}, {N}, 1] (per-row), got {_shape(scale)}")
    return scale.float().reshape(E, N)


def _block_scales(scale: Optional[torch.Tensor], E: int, N: int, K: int, bn: int, bk: int, name: str) -> torch.Tensor:
    _require(scale is not None, f"{name}: required with use_fp8_w8a8")
    _require(scale.dtype == torch.float32, f"{name}: dtype must be float32, got {scale.dtype}")
    want = [E, _ceil_div(N, bn), _ceil_div(K, bk)]
    _require(_shape(scale) == want, f"{name}: block scales must have shape {want}, got {_shape(scale)}")
    return scale


def _block_gemm(q: torch.Tensor, q_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                bn: int, bk: int) -> torch.Tensor:
    """sum over K-blocks b of (q[:, b] . wq[n, b]) * q_scale[:, b] * w_scale[n // bn, b]   [rows, N].

    Each partial dot is promoted with (activation group scale x weight block scale) before it joins
    the f32 row sum, block 0 first, as the DeepGEMM-style kernels and fused_moe_ref_fp8_block do.
    """
    N, K = wq.shape
    w_rows = w_scale.repeat_interleave(bn, dim=0)[:N]  # [N, K-blocks]: the scale of each row
    acc = torch.zeros(q.shape[0], N, dtype=torch.float32, device=q.device)
    for b, c0 in enumerate(range(0, K, bk)):
        partial = q[:, c0:c0 + bk] @ wq[:, c0:c0 + bk].T
        acc = acc + partial * (q_scale[:, b:b + 1] * w_rows[:, b].unsqueeze(0))
    return acc


def ref_fused_experts(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, activation: Any = "silu", apply_router_weight_on_input: bool = False,
                      global_num_experts: int = -1, expert_map: Optional[torch.Tensor] = None,
                      quant_config: Any = None, *, use_fp8_w8a8: bool = False, per_channel_quant: bool = False,
                      block_shape: Optional[Sequence[int]] = None, w1_scale: Optional[torch.Tensor] = None,
                      w2_scale: Optional[torch.Tensor] = None, a1_scale: Optional[torch.Tensor] = None,
                      weight_layout: str = "row_major", out: Optional[torch.Tensor] = None,
                      round_intermediate: bool = True) -> torch.Tensor:
    """Fused MoE (SPEC 3), vLLM 0.33's fused_experts signature. Returns out [T, H] (x's dtype).

    x [T, H] bf16|f16|f32; w1 [E, 2I, H] (gate rows, then up rows; [E, I, H] = gate only), w2
    [E, H, I]; topk_ids [T, k] GLOBAL ids in [-1, Eg) (-1 = no expert), int32 (another integer
    dtype is accepted, as moekit.api converts it); topk_weights [T, k] f32 (other floats: used as f32).
      h = w1[e] . x_t (f32)     a = act(g) * u     y_t = sum_j w_tj * (w2[e_tj] . a)   (f32, one rounding)
    Schemes (SPEC 6 order):
      use_fp8_w8a8 + block_shape (bn, bk): fp8 e4m3fn weights with [E, ceil(N/bn), ceil(K/bk)] scales,
        activations (x and a) quantized dynamically per (row, 1 x bk group)            (SPEC 3.3)
      use_fp8_w8a8: fp8 weights with per-tensor [E] or per-row [E, N(, 1)] scales (per_channel_quant
        asks for per-row), activations quantized dynamically per row (x: per token, a: per (token,
        slot)), or x with the static a1_scale [1]                                      (SPEC 3.2)
      otherwise: weights of x's dtype; a is rounded to x's dtype before the down projection unless
        round_intermediate=False (a reference-only knob; the ops always round)        (SPEC 3.1)
    apply_router_weight_on_input (k == 1): h (= g and u) is scaled by w in f32 right after the first
    GEMM and there is no final weight (SPEC 3.4). expert_map [Eg] int32 maps a global id to its
    local index or -1 (remote: skipped, SPEC 3.5); global_num_experts is Eg (-1: len(expert_map),
    or E without a map). activation is a name or a vLLM MoEActivation (*_NO_MUL: gate-only w1);
    quant_config (vLLM's FusedMoEQuantConfig, duck-typed) stands for the fp8 keywords
    (moekit._vllm_args.quant_kwargs); weight_layout names w1 / w2's layout, undone first
    (ref_unprepack). Every argument, including the id and map values, is checked before `out` is
    written.
    """
    act = _vllm_args.activation_name(activation, w1, w2)
    q = _vllm_args.quant_kwargs(quant_config, dict(
        use_fp8_w8a8=use_fp8_w8a8, per_channel_quant=per_channel_quant, block_shape=block_shape, w1_scale=w1_scale,
        w2_scale=w2_scale, a1_scale=a1_scale))
    use_fp8_w8a8, per_channel_quant, block_shape = q["use_fp8_w8a8"], q["per_channel_quant"], q["block_shape"]
    w1_scale, w2_scale, a1_scale = q["w1_scale"], q["w2_scale"], q["a1_scale"]
    weight_layout = _vllm_args.check_weight_layout(weight_layout, "weight_layout")
    if weight_layout != "row_major":
        _require(w1.dim() == 3 and w2.dim() == 3, f"w1, w2: must be 3-D, got shapes {_shape(w1)} and {_shape(w2)}")
        w1, w2 = _unprepack(w1, weight_layout, "w1"), _unprepack(w2, weight_layout, "w2")
    x, ids, wts = hidden_states, topk_ids, topk_weights
    _require(x.dim() == 2, f"hidden_states: must be 2-D [T, H], got shape {_shape(x)}")
    _require(x.dtype in (torch.bfloat16, torch.float16, torch.float32),
             f"hidden_states: dtype must be bfloat16, float16 or float32, got {x.dtype}")
    T, H = x.shape
    _require(w1.dim() == 3 and w2.dim() == 3, f"w1, w2: must be 3-D, got shapes {_shape(w1)} and {_shape(w2)}")
    E, N1, inter = w1.shape[0], w1.shape[1], w2.shape[2]
    _require(_shape(w2)[:2] == [E, H], f"w2: shape must be [{E}, {H}, I], got {_shape(w2)}")
    _require(w1.shape[2] == H and N1 in (inter, 2 * inter),
             f"w1: shape must be [{E}, 2*I = {2 * inter} (or I = {inter}), {H}], got {_shape(w1)}")
    w_dtype = torch.float8_e4m3fn if use_fp8_w8a8 else x.dtype
    _require(w1.dtype == w_dtype and w2.dtype == w_dtype,
             f"w1, w2: dtype must be {w_dtype}, got {w1.dtype} and {w2.dtype}")
    _require(ids.dim() == 2 and ids.shape[0] == T, f"topk_ids: shape must be [{T}, k], got {_shape(ids)}")
    k = ids.shape[1]
    _require(not ids.dtype.is_floating_point and not ids.dtype.is_complex and ids.dtype != torch.bool,
             f"topk_ids: dtype must be an integer type (int32 preferred), got {ids.dtype}")
    _require(_shape(wts) == [T, k], f"topk_weights: shape must be [{T}, {k}], got {_shape(wts)}")
    _require(wts.dtype.is_floating_point, f"topk_weights: dtype must be floating point (float32 preferred), "
                                          f"got {wts.dtype}")
    _require(not apply_router_weight_on_input or k == 1,
             f"apply_router_weight_on_input: needs topk == 1, got topk {k}")
    if out is not None:
        _require(_shape(out) == [T, H] and out.dtype == x.dtype,
                 f"out: must be [{T}, {H}] {x.dtype}, got {_shape(out)} {out.dtype}")

    scheme = "unquantized"
    if use_fp8_w8a8:
        scheme = "fp8_row"
        if block_shape is not None:
            scheme = "fp8_block"
            _require(len(block_shape) == 2 and min(block_shape) >= 1,
                     f"block_shape: must be [bn, bk] with sizes >= 1, got {list(block_shape)}")
            _require(not per_channel_quant, "per_channel_quant: not allowed together with block_shape")
            _require(a1_scale is None, "a1_scale: not used with block_shape (activations are quantized per group)")
            bn, bk = int(block_shape[0]), int(block_shape[1])
            s1 = _block_scales(w1_scale, E, N1, H, bn, bk, "w1_scale")
            s2 = _block_scales(w2_scale, E, H, inter, bn, bk, "w2_scale")
        else:
            s1 = _row_scales(w1_scale, E, N1, per_channel_quant, "w1_scale")
            s2 = _row_scales(w2_scale, E, H, per_channel_quant, "w2_scale")
            if a1_scale is not None:
                _require(a1_scale.numel() == 1 and a1_scale.dtype == torch.float32,
                         f"a1_scale: must be one float32 value, got shape {_shape(a1_scale)} {a1_scale.dtype}")
    else:
        for name, v in (("block_shape", block_shape), ("w1_scale", w1_scale), ("w2_scale", w2_scale),
                        ("a1_scale", a1_scale)):
            _require(v is None, f"{name}: only used with use_fp8_w8a8=True")

    # Global -> local expert table (data-dependent checks: still before anything is written).
    if expert_map is not None:
        _require(expert_map.dim() == 1 and expert_map.dtype == torch.int32,
                 f"expert_map: must be 1-D int32 [Eg], got {_shape(expert_map)} {expert_map.dtype}")
        Eg = expert_map.shape[0]
        _require(global_num_experts in (-1, Eg), f"global_num_experts: must be -1 or len(expert_map) = {Eg}, "
                                                 f"got {global_num_experts}")
        bad = expert_map[(expert_map < -1) | (expert_map >= E)]
        _require(bad.numel() == 0, f"expert_map: values must be in [-1, {E}), got {bad[:1].tolist()}")
        local_of = expert_map.long()
    else:
        Eg = E
        _require(global_num_experts in (-1, E), f"global_num_experts: must be -1 or E = {E} without an "
                                                f"expert_map, got {global_num_experts}")
        local_of = torch.arange(E, device=ids.device)
    bad = ids[(ids < -1) | (ids >= Eg)]
    _require(bad.numel() == 0, f"topk_ids: values must be in [-1, {Eg}), got {bad[:1].tolist()}")
    if T == 0:
        return out if out is not None else torch.empty_like(x)

    ids64 = ids.long()
    local = torch.where(ids64 >= 0, local_of[ids64.clamp_min(0)], torch.full_like(ids64, -1))  # [T, k]
    w = wts.float()
    w_in = w if apply_router_weight_on_input else torch.ones_like(w)   # scales h (g and u)
    w_out = torch.ones_like(w) if apply_router_weight_on_input else w  # scales the expert output
    xf = x.float()
    if scheme == "fp8_row":
        if a1_scale is not None:  # static activation scale
            xs = a1_scale.float().reshape(1, 1).expand(T, 1)
            xq = ref_cast_fp8(xf / xs).float()
        else:
            xq, xs = _quant_act_rows(xf)
    elif scheme == "fp8_block":
        xq, xs = _quant_act_groups(xf, bk)

    slot_out = torch.zeros(T, k, H, dtype=torch.float32, device=x.device)  # w2[e] . a per (token, slot)
    for e in range(E):
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        if scheme == "unquantized":
            h = xf[tok] @ w1[e].float().T
        elif scheme == "fp8_row":
            h = (xq[tok] @ w1[e].float().T) * xs[tok] * s1[e].unsqueeze(0)
        else:
            h = _block_gemm(xq[tok], xs[tok], w1[e].float(), s1[e], bn, bk)
        h = h * w_in[tok, slot].unsqueeze(1)
        a = _act_and_mul(h, act, inter)
        if scheme == "unquantized":
            if round_intermediate:
                a = a.to(x.dtype).float()
            y = a @ w2[e].float().T
        elif scheme == "fp8_row":
            aq, a_s = _quant_act_rows(a)  # per (token, slot) row
            y = (aq @ w2[e].float().T) * a_s * s2[e].unsqueeze(0)
        else:
            aq, a_s = _quant_act_groups(a, bk)  # per (token, slot, bk group)
            y = _block_gemm(aq, a_s, w2[e].float(), s2[e], bn, bk)
        slot_out[tok, slot] = y

    # y_t = sum_j w_out * slot_out, slot 0 first; -1 ids and remote experts contribute nothing.
    acc = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for j in range(k):
        contrib = w_out[:, j:j + 1] * slot_out[:, j]
        acc = acc + torch.where((local[:, j] >= 0).unsqueeze(1), contrib, torch.zeros_like(contrib))
    result = acc.to(x.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
