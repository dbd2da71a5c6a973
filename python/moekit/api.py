"""The public functions of the ``moekit`` package, with the signatures of vLLM 0.33's fused-MoE functions.

Each function allocates its outputs and calls one torch.ops.moekit op (csrc/torch/), or, when the
environment switch ``MOEKIT_USE_FUSED_MOE`` is off, the pure-torch twin of the same name prefixed
``ref_`` in moekit.reference (same signature). The switch is read once, at import. The C++
library's own switches (MOEKIT_BACKEND, MOEKIT_FORCE_KERNEL, MOEKIT_PRINT_DISPATCH,
MOEKIT_DETERMINISTIC, MOEKIT_NUM_THREADS; docs/env.md) apply to the op path as they do in C++.

vLLM 0.33 (the pinned version): fused_topk, grouped_topk and fused_experts take the parameters of
vllm.model_executor.layers.fused_moe's functions of the same name, in the same order with the same
defaults, and return what they return (fused_topk: three tensors). fused_experts also takes
moekit's fp8 keywords and weight_layout as keyword-only extras; its activation (str or
MoEActivation) and quant_config (FusedMoEQuantConfig, duck-typed) are read by moekit._vllm_args,
without importing vLLM. prepack / unprepack lay weights out for weight_layout (the packed CPU path).

Contracts: docs/spec.md and include/moekit/ops/*.h; argument errors raise ValueError with the C++
message ("moekit.fused_moe: topk_ids: shape must be [4, 2], got [4, 3]") or this module's
("moekit: topk_ids: dtype must be ..."), unsupported problems NotImplementedError, a failed
allocation torch.OutOfMemoryError (docs/python.md, "Errors"). Tests: tests/python/test_ops.py,
test_errors.py, test_api_vllm.py; docs: docs/python.md.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Optional, Sequence, Tuple

import torch

from . import _ops, _vllm_args

__all__ = [
    "USE_FUSED_MOE",
    "fused_topk",
    "grouped_topk",
    "sigmoid_topk",
    "fused_experts",
    "fused_experts_kernel",
    "prepack",
    "unprepack",
    "shuffle_weight",
    "unshuffle_weight",
    "quantize_fp8",
    "convert_fp8_fnuz_to_fn",
    "sort_tokens",
    "sort_tokens_max_padded",
    "sort_tokens_max_blocks",
]


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name}: must be 0 or 1 (or true/false, on/off, yes/no), got {os.environ[name]!r}")


#: MOEKIT_USE_FUSED_MOE (default on): True = torch.ops.moekit, False = moekit.reference.
USE_FUSED_MOE: bool = _env_flag("MOEKIT_USE_FUSED_MOE", True)

if USE_FUSED_MOE and not _ops.loaded:
    raise ImportError(f"moekit: the torch.ops.moekit extension is not available ({_ops.load_error}); "
                      "set MOEKIT_USE_FUSED_MOE=0 to use the pure-torch reference instead")


def _reference():
    # Imported on first use: the op path never needs it.
    from . import reference

    return reference


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"moekit: {message}")


# Integer dtypes accepted for ids / maps: converted to int32 exactly, or range-checked first.
_INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
_INT32 = torch.iinfo(torch.int32)


def _values_readable(t: torch.Tensor) -> bool:
    """True where reading t's values is allowed: not under torch.compile / export tracing (values
    unknown, a read would break the graph), not during CUDA-graph capture (a host sync is illegal
    there), not a meta or fake tensor (no data)."""
    if torch.compiler.is_compiling() or t.device.type == "meta" or _is_fake(t):
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # a torch without FakeTensor: nothing is fake
        return False
    return is_fake(t)


def _index_tensor(t: torch.Tensor, name: str, lo: int, hi: int, what: str) -> torch.Tensor:
    """t as int32 for the ops. ValueError for a non-integer dtype and, for a dtype wider than int32
    (int64), for values outside [lo, hi), found BEFORE converting (a cast would wrap 2**32 + 1 to 1).

    int32 and narrower dtypes are not read here: the op checks their values (CPU) or its kernels
    skip bad ones (CUDA), so int32 CUDA tensors stay sync-free. int64 on CUDA costs one host sync
    (min / max). Where values cannot be read (torch.compile / export tracing, CUDA-graph capture,
    meta and fake tensors) the out-of-range ones become INT32_MIN instead, which the op rejects
    (CPU) or skips (CUDA) like any bad id, rather than wrapping into a valid one.
    """
    _require(t.dtype in _INDEX_DTYPES, f"{name}: dtype must be int32 or int64 (or int16, int8, uint8), "
                                       f"got {t.dtype}")
    if t.dtype == torch.int32:
        return t
    info = torch.iinfo(t.dtype)
    if info.min >= _INT32.min and info.max <= _INT32.max:
        return t.to(torch.int32)  # exact; the op checks the values
    if not _values_readable(t):
        return t.masked_fill((t < lo) | (t >= hi), _INT32.min).to(torch.int32)
    if t.numel() > 0:
        low, high = torch.stack(torch.aminmax(t)).tolist()
        if low < lo or high >= hi:
            idx = ((t < lo) | (t >= hi)).nonzero()[0].tolist()
            raise ValueError(f"moekit: {name}[{', '.join(map(str, idx))}]: {what} must be in [{lo}, {hi}), "
                             f"got {t[tuple(idx)].item()}")
    return t.to(torch.int32)


def _float_tensor(t: torch.Tensor, name: str) -> torch.Tensor:
    """t as float32; ValueError for a non-floating dtype (ints, bool: e.g. ids passed as weights;
    complex: the cast would drop the imaginary part)."""
    _require(t.dtype.is_floating_point, f"{name}: dtype must be a floating point type (float32 preferred), "
                                        f"got {t.dtype}")
    return t.to(torch.float32)


def _check_topk(topk: int, gating_output: torch.Tensor) -> int:
    # Checked before the outputs [T, topk] are allocated (a negative or huge topk would fail there).
    E = gating_output.shape[1]
    try:
        k = operator.index(topk)
    except TypeError:
        raise ValueError(f"moekit: topk: must be an integer, got {topk!r}") from None
    _require(1 <= k <= E, f"topk: must be in [1, E={E}], got {k}")
    return k


# The CPU kernels' thread count follows torch.get_num_threads() unless MOEKIT_NUM_THREADS is set
# (then the library keeps that). Checked per call (cheap), pushed to the library when it changes.
_THREADS_FROM_ENV = bool(os.environ.get("MOEKIT_NUM_THREADS"))
_threads_set = 0


def _follow_torch_threads(t: torch.Tensor) -> None:
    global _threads_set
    if _THREADS_FROM_ENV or t.device.type != "cpu" or torch.compiler.is_compiling():
        return
    n = torch.get_num_threads()
    if n != _threads_set and hasattr(torch.ops.moekit, "set_num_threads"):
        torch.ops.moekit.set_num_threads(n)
        _threads_set = n


def _check_tokens(hidden_states: Optional[torch.Tensor], gating_output: torch.Tensor) -> None:
    _follow_torch_threads(gating_output)
    _require(gating_output.dim() == 2, f"gating_output: must be 2-D [T, E], got shape {list(gating_output.shape)}")
    if hidden_states is not None:
        _require(hidden_states.shape[0] == gating_output.shape[0],
                 f"hidden_states: must have the {gating_output.shape[0]} tokens of gating_output, "
                 f"got shape {list(hidden_states.shape)}")


def _routing_outputs(gating_output: torch.Tensor, topk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    T = gating_output.shape[0]
    weights = torch.empty((T, topk), dtype=torch.float32, device=gating_output.device)
    ids = torch.empty((T, topk), dtype=torch.int32, device=gating_output.device)
    return weights, ids


# ------------------------------------------------------------------------------------ routing
def fused_topk(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
               indices_type: Optional[torch.dtype] = None, scoring_func: str = "softmax"
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing (SPEC 1.1; Mixtral, Qwen3), vLLM 0.33's fused_topk.

    Returns (topk_weights f32 [T, k], topk_ids [T, k] int32 (or indices_type), token_expert_indices
    int32 [T, k] with [t, j] = j * T + t). scoring_func "softmax": weights = softmax(logits) of the
    top k, renormalized to sum 1 if asked. "sigmoid": the top k logits, weights = sigmoid(logit),
    renormalized if asked (rows whose weights sum to 0 kept as they are); ids and weights from the
    sigmoid_topk op, the renormalization and token_expert_indices in torch. The ids are picked on
    the logits, which orders them as their sigmoids do, except that logits above ~17 whose sigmoids
    round to the same f32 value are still told apart here (vLLM's kernel takes the lower id).
    """
    if not USE_FUSED_MOE:
        return _reference().ref_fused_topk(hidden_states, gating_output, topk, renormalize, indices_type,
                                           scoring_func)
    _check_tokens(hidden_states, gating_output)
    k = _check_topk(topk, gating_output)
    _vllm_args.check_indices_type(indices_type, gating_output.shape[1], "moekit: ")
    _require(scoring_func in ("softmax", "sigmoid"),
             f"scoring_func: must be 'softmax' or 'sigmoid', got {scoring_func!r}")
    weights, ids = _routing_outputs(gating_output, k)
    if scoring_func == "softmax":
        token_expert_indices = torch.empty_like(ids)
        torch.ops.moekit.topk_softmax(weights, ids, token_expert_indices, gating_output, renormalize)
    else:
        torch.ops.moekit.sigmoid_topk(weights, ids, gating_output)
        if renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            weights = torch.where(total > 0, weights / total, weights)
        token_expert_indices = _vllm_args.token_expert_indices(ids.shape[0], k, ids.device)
    if indices_type is not None and indices_type != torch.int32:
        ids = ids.to(indices_type)
    return weights, ids, token_expert_indices


def grouped_topk(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                 num_expert_group: int = 0, topk_group: int = 0, scoring_func: str = "softmax",
                 routed_scaling_factor: float = 1.0, e_score_correction_bias: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Grouped top-k (SPEC 1.2; DeepSeek-V2/V3), vLLM 0.33's grouped_topk: (topk_weights f32 [T, k],
    topk_ids int32 [T, k]).

    The correction bias is for selection only and is used in f32; routed_scaling_factor is applied
    here, once, as vLLM's grouped_topk does (the model must not apply it again). num_expert_group
    must be set (>= 1, dividing E): vLLM's default 0 means no groups, where its router calls
    fused_topk instead.
    """
    if not USE_FUSED_MOE:
        return _reference().ref_grouped_topk(hidden_states, gating_output, topk, renormalize, num_expert_group,
                                             topk_group, scoring_func, routed_scaling_factor,
                                             e_score_correction_bias)
    _vllm_args.check_grouped_args(num_expert_group, routed_scaling_factor, e_score_correction_bias, "moekit: ")
    _check_tokens(hidden_states, gating_output)
    weights, ids = _routing_outputs(gating_output, _check_topk(topk, gating_output))
    bias = e_score_correction_bias
    if bias is not None:
        # Integer biases convert exactly (as in the reference); a complex one would lose its imaginary part.
        _require(not bias.dtype.is_complex, f"e_score_correction_bias: dtype must be real, got {bias.dtype}")
        bias = bias.to(torch.float32)
    torch.ops.moekit.grouped_topk(weights, ids, gating_output, bias, num_expert_group, topk_group, scoring_func,
                                  renormalize, float(routed_scaling_factor))
    return weights, ids


def sigmoid_topk(gating_output: torch.Tensor, topk: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the raw logits, weight = sigmoid(logit), no renormalization (SPEC 1.3; Llama-4)."""
    if not USE_FUSED_MOE:
        return _reference().ref_sigmoid_topk(gating_output, topk)
    _check_tokens(None, gating_output)
    weights, ids = _routing_outputs(gating_output, _check_topk(topk, gating_output))
    torch.ops.moekit.sigmoid_topk(weights, ids, gating_output)
    return weights, ids


# ----------------------------------------------------------------------------------- fused MoE
def fused_experts(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: Any = "silu", apply_router_weight_on_input: bool = False,
                  global_num_experts: int = -1, expert_map: Optional[torch.Tensor] = None, quant_config: Any = None,
                  *, use_fp8_w8a8: bool = False, per_channel_quant: bool = False,
                  block_shape: Optional[Sequence[int]] = None, w1_scale: Optional[torch.Tensor] = None,
                  w2_scale: Optional[torch.Tensor] = None, a1_scale: Optional[torch.Tensor] = None,
                  weight_layout: str = "row_major", out: Optional[torch.Tensor] = None,
                  config: Optional[str] = None) -> torch.Tensor:
    """Fused MoE (SPEC 3), vLLM 0.33's fused_experts: returns out [T, H] of hidden_states' dtype
    (written in place when given).

    w1 [E, 2I, H] (gate rows, then up rows; [E, I, H] = gate only), w2 [E, H, I]; topk_ids [T, k]
    global expert ids (-1 = none), topk_weights [T, k]. activation: "silu", "gelu" (erf),
    "gelu_tanh", or a vLLM MoEActivation (SILU, GELU, GELU_TANH; *_NO_MUL = gate-only w1).
    The quantization comes either as vLLM's quant_config (a FusedMoEQuantConfig or any object with
    its attributes; mapping in moekit._vllm_args.quant_kwargs) or as moekit's keyword-only
    extras, not both. Schemes, picked from the data (SPEC 6):
      use_fp8_w8a8 and block_shape (bn, bk): fp8 weights, w1_scale [E, ceil(2I/bn), ceil(H/bk)],
        w2_scale [E, ceil(H/bn), ceil(I/bk)], activations quantized per 1 x bk group  (SPEC 3.3)
      use_fp8_w8a8: fp8 weights, per-tensor [E] or per-row [E, N(, 1)] scales, activations per
        token (or the static a1_scale [1])                                             (SPEC 3.2)
      otherwise: weights of hidden_states' dtype                                       (SPEC 3.1)
    apply_router_weight_on_input (k == 1, Llama-4): the weight scales the expert input, no final
    weight (SPEC 3.4). expert_map [Eg] int32: local index of each global expert or -1 (SPEC 3.5);
    global_num_experts: Eg (-1 = len(expert_map), or E without a map). topk_ids / expert_map of
    another integer dtype (int64 from torch.topk) are converted to int32, int64 values checked first
    (one host sync on CUDA; see _index_tensor); topk_weights of another float dtype to float32.
    Other dtypes (float / bool / complex ids, integer weights) raise ValueError.
    weight_layout: how w1 and w2 are laid out, never guessed (a laid-out tensor keeps its shape and
    dtype): "row_major", "cpu_vnni2_n32" (from prepack: the AVX-512 BF16 CPU kernels' fast path) or
    "shuffled_16x16" (from shuffle_weight / prepack).
    config: the CUDA kernels' config to run (docs/fused_moe_configs.md, e.g. "grouped/64x256.ring5+k2";
    over MOEKIT_FUSED_MOE_CONFIG); only kernels that take configs may then run the call, so a CPU
    call with one fails. The pure-torch reference (MOEKIT_USE_FUSED_MOE=0) has no configs and
    ignores it.
    """
    if not USE_FUSED_MOE:
        return _reference().ref_fused_experts(
            hidden_states, w1, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input,
            global_num_experts, expert_map, quant_config, use_fp8_w8a8=use_fp8_w8a8,
            per_channel_quant=per_channel_quant, block_shape=block_shape, w1_scale=w1_scale, w2_scale=w2_scale,
            a1_scale=a1_scale, weight_layout=weight_layout, out=out)
    args, kwargs = _fused_moe_op_args(hidden_states, w1, w2, topk_weights, topk_ids, activation,
                                      apply_router_weight_on_input, global_num_experts, expert_map, quant_config,
                                      dict(use_fp8_w8a8=use_fp8_w8a8, per_channel_quant=per_channel_quant,
                                           block_shape=block_shape, w1_scale=w1_scale, w2_scale=w2_scale,
                                           a1_scale=a1_scale), weight_layout, out, config)
    torch.ops.moekit.fused_moe(*args, **kwargs)
    return args[0]


def fused_experts_kernel(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor, activation: Any = "silu", apply_router_weight_on_input: bool = False,
                         global_num_experts: int = -1, expert_map: Optional[torch.Tensor] = None,
                         quant_config: Any = None, *, use_fp8_w8a8: bool = False, per_channel_quant: bool = False,
                         block_shape: Optional[Sequence[int]] = None, w1_scale: Optional[torch.Tensor] = None,
                         w2_scale: Optional[torch.Tensor] = None, a1_scale: Optional[torch.Tensor] = None,
                         weight_layout: str = "row_major", out: Optional[torch.Tensor] = None,
                         config: Optional[str] = None) -> str:
    """The name of the moekit kernel fused_experts would run for the same arguments, without running
    it (the registry's rule, MOEKIT_BACKEND / MOEKIT_FORCE_KERNEL included; the same checks and
    errors). What an engine logs; "reference" under MOEKIT_USE_FUSED_MOE=0. No host sync for int32
    ids."""
    if not USE_FUSED_MOE:
        return "reference"
    args, kwargs = _fused_moe_op_args(hidden_states, w1, w2, topk_weights, topk_ids, activation,
                                      apply_router_weight_on_input, global_num_experts, expert_map, quant_config,
                                      dict(use_fp8_w8a8=use_fp8_w8a8, per_channel_quant=per_channel_quant,
                                           block_shape=block_shape, w1_scale=w1_scale, w2_scale=w2_scale,
                                           a1_scale=a1_scale), weight_layout, out, config)
    return torch.ops.moekit.fused_moe_kernel(*args, **kwargs)


def _fused_moe_op_args(hidden_states, w1, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input,
                       global_num_experts, expert_map, quant_config, extras, weight_layout, out, config=None):
    """fused_experts' checks and conversions: the arguments of torch.ops.moekit.fused_moe (and of
    fused_moe_kernel), `out` first (allocated when None), after every check has passed."""
    act = _vllm_args.activation_name(activation, w1, w2, "moekit: ")
    weight_layout = _vllm_args.check_weight_layout(weight_layout, "weight_layout", "moekit: ")
    q = _vllm_args.quant_kwargs(quant_config, extras, "moekit: ")
    use_fp8_w8a8, per_channel_quant, block_shape = q["use_fp8_w8a8"], q["per_channel_quant"], q["block_shape"]
    w1_scale, w2_scale, a1_scale = q["w1_scale"], q["w2_scale"], q["a1_scale"]
    fp8_weights = w1.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    _require(use_fp8_w8a8 == fp8_weights,
             f"use_fp8_w8a8={use_fp8_w8a8} does not match the weights: w1 dtype is {w1.dtype}")
    _require(block_shape is None or (use_fp8_w8a8 and len(block_shape) == 2),
             f"block_shape: needs use_fp8_w8a8 and two sizes (bn, bk), got {block_shape}")
    if not use_fp8_w8a8:
        for name, v in (("w1_scale", w1_scale), ("w2_scale", w2_scale), ("a1_scale", a1_scale)):
            _require(v is None, f"{name}: only used with use_fp8_w8a8=True")
    _require(not per_channel_quant or (w1_scale is not None and w1_scale.dim() >= 2 and block_shape is None),
             "per_channel_quant: needs per-row w1_scale [E, N] or [E, N, 1] and no block_shape, got "
             f"w1_scale shape {None if w1_scale is None else list(w1_scale.shape)}")
    _require(config is None or isinstance(config, str), f"config: a config name (str) or None, got {config!r}")
    _require(w1.dim() == 3, f"w1: must be 3-D [E, 2I (or I), H], got shape {list(w1.shape)}")
    E = w1.shape[0]
    if expert_map is not None:
        _require(expert_map.dim() == 1, f"expert_map: must be 1-D [Eg], got shape {list(expert_map.shape)}")
        Eg = expert_map.shape[0]
        _require(global_num_experts in (-1, Eg),
                 f"global_num_experts: must be -1 or len(expert_map) = {Eg}, got {global_num_experts}")
        expert_map = _index_tensor(expert_map, "expert_map", -1, E, "local expert (or -1)")
    else:
        Eg = E
        _require(global_num_experts in (-1, E),
                 f"global_num_experts: without expert_map must be -1 or E = {E}, got {global_num_experts}")
    # Both converted (and int64 ids range-checked) before `out` is allocated or written.
    topk_ids = _index_tensor(topk_ids, "topk_ids", -1, Eg, "expert id")
    topk_weights = _float_tensor(topk_weights, "topk_weights")
    if out is None:
        out = torch.empty_like(hidden_states)
    _follow_torch_threads(hidden_states)
    bn, bk = (int(block_shape[0]), int(block_shape[1])) if block_shape is not None else (0, 0)
    return ((out, hidden_states, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, None, expert_map, act,
             apply_router_weight_on_input, bn, bk), dict(weight_layout=weight_layout, config=config))


# ------------------------------------------------------------------------------ weight layout
def shuffle_weight(w: torch.Tensor, layout: Sequence[int] = (16, 16)) -> torch.Tensor:
    """AITER (16, 16) weight layout (SPEC 4): same shape and dtype, bits permuted per [N, K] matrix."""
    if not USE_FUSED_MOE:
        return _reference().ref_shuffle_weight(w, layout)
    _require(tuple(layout) == (16, 16), f"layout: only (16, 16) is supported, got {tuple(layout)}")
    out = torch.empty_like(w, memory_format=torch.contiguous_format)
    torch.ops.moekit.shuffle_weight(out, w)
    return out


def unshuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """The exact inverse of shuffle_weight."""
    if not USE_FUSED_MOE:
        return _reference().ref_unshuffle_weight(w)
    out = torch.empty_like(w, memory_format=torch.contiguous_format)
    torch.ops.moekit.unshuffle_weight(out, w)
    return out


def prepack(w: torch.Tensor, layout: str = "cpu_vnni2_n32") -> torch.Tensor:
    """w [..., N, K] laid out for fused_experts(..., weight_layout=layout): a contiguous tensor of
    the same shape and dtype, new but for row_major (SPEC 4; moekit/ops/layout.h). Done once, at
    load, for w1 and w2.

    "cpu_vnni2_n32": each [N, K] matrix as 32-row VNNI-2 panels [N/32][K/2][32][2] (pack_weight);
    bf16, f16 and fp8 e4m3 weights, N % 32 == 0 and K % 2 == 0, CPU tensors only. The CPU kernels
    with AVX-512 BF16 read them on their fast path (fused_moe_avx512_bf16; fp8 per-tensor / per-row:
    fused_moe_avx512_fp8_row; H and I multiples of 32); the other kernels read them element by
    element, with the same result as row_major but slower, so pack only for such CPUs.
    "shuffled_16x16": AITER's layout (shuffle_weight). "row_major": w itself, made contiguous.
    A packed tensor looks like any other (same shape, dtype, strides): fused_experts learns its
    layout from weight_layout only, and packing twice is not detected. unprepack is the inverse.
    """
    if not USE_FUSED_MOE:
        return _reference().ref_prepack(w, layout)
    return _relayout(w, layout, shuffle_weight, torch.ops.moekit.pack_weight)


def unprepack(w: torch.Tensor, layout: str = "cpu_vnni2_n32") -> torch.Tensor:
    """The exact inverse of prepack(w, layout): the row_major weights, bit for bit."""
    if not USE_FUSED_MOE:
        return _reference().ref_unprepack(w, layout)
    return _relayout(w, layout, unshuffle_weight, torch.ops.moekit.unpack_weight)


def _relayout(w: torch.Tensor, layout: str, shuffle, pack_op) -> torch.Tensor:
    """prepack / unprepack: row_major = contiguous w; shuffled_16x16 = shuffle(w); else pack_op."""
    layout = _vllm_args.check_weight_layout(layout, "layout", "moekit: ")
    if layout == "row_major":
        return w.contiguous()
    if layout == "shuffled_16x16":
        return shuffle(w)
    w = w.contiguous()
    out = torch.empty_like(w)
    pack_op(out, w, layout)
    return out


# -------------------------------------------------------------------------------- quantization
def _scale_shape(x: torch.Tensor, granularity: str, group: int, block: Sequence[int]) -> Tuple[int, ...]:
    lead = tuple(x.shape[:-1])
    if granularity == "per_tensor":
        return (1,)
    _require(x.dim() >= 1, f"x: {granularity} needs at least 1 dim, got shape {list(x.shape)}")
    if granularity == "per_row":
        return lead + (1,)
    if granularity == "per_token_group":
        _require(group >= 1, f"group: must be >= 1, got {group}")
        return lead + (_ceil_div(x.shape[-1], group),)
    if granularity == "block":
        _require(x.dim() >= 2, f"x: block needs at least 2 dims, got shape {list(x.shape)}")
        _require(len(block) == 2 and min(block) >= 1, f"block: must be two sizes >= 1, got {tuple(block)}")
        return tuple(x.shape[:-2]) + (_ceil_div(x.shape[-2], block[0]), _ceil_div(x.shape[-1], block[1]))
    raise ValueError(f"moekit: granularity: must be one of per_tensor, per_row, per_token_group, block, "
                     f"got {granularity!r}")


def quantize_fp8(x: torch.Tensor, granularity: str = "per_tensor", group: int = 128,
                 block: Sequence[int] = (128, 128), dtype: torch.dtype = torch.float8_e4m3fn,
                 scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp8 quantization (SPEC 5): (q of `dtype`, f32 scale).

    Scale shapes: per_tensor [1]; per_row [..., 1]; per_token_group [..., ceil(K / group)]; block
    [..., ceil(N / bn), ceil(K / bk)]. scale = max(amax, 1e-12) / fp8_max per group, q = fp8(x /
    scale) (round to nearest even, saturate). A given `scale` (per_tensor only) is static.
    """
    if not USE_FUSED_MOE:
        return _reference().ref_quantize_fp8(x, granularity, group, block, dtype, scale)
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    if scale is not None:
        _require(granularity == "per_tensor", f"scale: a static scale needs per_tensor, got {granularity!r}")
        torch.ops.moekit.quantize_fp8_static(q, x, scale)
        return q, scale
    s = torch.empty(_scale_shape(x, granularity, group, block), dtype=torch.float32, device=x.device)
    group_k = int(block[1]) if granularity == "block" else int(group)
    block_n = int(block[0]) if granularity == "block" else 128
    torch.ops.moekit.quantize_fp8(q, s, x, granularity, group_k, block_n)
    return q, s


def convert_fp8_fnuz_to_fn(q: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz checkpoint -> e4m3fn (SPEC 5): bits kept (NaN -> 0, +-240 -> +-448), scales x 0.5."""
    if not USE_FUSED_MOE:
        return _reference().ref_convert_fp8_fnuz_to_fn(q, scale)
    out = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
    scale_out = torch.empty_like(scale)
    torch.ops.moekit.convert_fp8(out, scale_out, q, scale)
    return out, scale_out


# ------------------------------------------------------------------------------------ sorting
def sort_tokens_max_padded(num_tokens: int, topk: int, num_experts: int, block_m: int) -> int:
    """Capacity of sorted_token_ids / sorted_weights (moekit/ops/sorting.h sort_tokens_max_padded)."""
    spec = num_tokens * topk + num_experts * block_m - topk
    worst = num_tokens * topk + min(num_experts, num_tokens * topk) * (block_m - 1)
    return max(spec, worst, 0)


def sort_tokens_max_blocks(num_tokens: int, topk: int, num_experts: int, block_m: int) -> int:
    """Capacity of sorted_expert_ids: ceil(max_padded / block_m)."""
    return _ceil_div(sort_tokens_max_padded(num_tokens, topk, num_experts, block_m), block_m)


def sort_tokens(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, block_m: int,
                encoding: str = "packed", expert_mask: Optional[torch.Tensor] = None,
                expert_map: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token sorting by local expert (SPEC 2; moe_sorting / moe_align_block_size). Always the op.

    Returns (sorted_token_ids int32 [max_padded], sorted_weights f32 [max_padded], sorted_expert_ids
    int32 [max_blocks], num_valid int32 [1]); encoding "packed" ((slot << 24) | token) or "flat"
    (token * k + slot). topk_ids / expert_mask / expert_map of another integer dtype and
    topk_weights of another float dtype are converted as in fused_experts (int64 values checked).
    """
    _require(topk_ids.dim() == 2, f"topk_ids: must be 2-D [T, k], got shape {list(topk_ids.shape)}")
    T, k = topk_ids.shape
    dev = topk_ids.device
    _require(num_experts >= 1, f"num_experts: must be >= 1, got {num_experts}")
    _require(block_m >= 1, f"block_m: must be >= 1, got {block_m}")
    Eg = num_experts  # the ids' range: len of the mask / map when given (the op checks the rest)
    for name, table in (("expert_mask", expert_mask), ("expert_map", expert_map)):
        if table is not None:
            _require(table.dim() == 1, f"{name}: must be 1-D [Eg], got shape {list(table.shape)}")
            Eg = table.shape[0]
    if expert_mask is not None:
        expert_mask = _index_tensor(expert_mask, "expert_mask", 0, 2, "mask value")
    if expert_map is not None:
        expert_map = _index_tensor(expert_map, "expert_map", -1, num_experts, "local expert (or -1)")
    topk_ids = _index_tensor(topk_ids, "topk_ids", -1, Eg, "expert id")
    topk_weights = _float_tensor(topk_weights, "topk_weights")
    padded = sort_tokens_max_padded(T, k, num_experts, block_m)
    # Checked before allocating (the op checks it too): a huge num_experts or block_m would
    # otherwise fail in the allocator with a message that names neither.
    _require(padded <= _INT32.max, f"num_experts, block_m: max_padded = T*k + E*block_m - k must be <= 2^31 - 1, "
                                   f"got {padded} (T={T} k={k} E={num_experts} block_m={block_m})")
    blocks = _ceil_div(padded, block_m)
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=dev)
    sorted_weights = torch.empty(padded, dtype=torch.float32, device=dev)
    sorted_experts = torch.empty(blocks, dtype=torch.int32, device=dev)
    num_valid = torch.empty(1, dtype=torch.int32, device=dev)
    torch.ops.moekit.sort_tokens(sorted_ids, sorted_weights, sorted_experts, num_valid, topk_ids, topk_weights,
                                 num_experts, block_m, encoding, expert_mask, expert_map)
    return sorted_ids, sorted_weights, sorted_experts, num_valid
