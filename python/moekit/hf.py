"""moekit as a Hugging Face transformers experts implementation (transformers >= 5.17).

transformers 5.x resolves every MoE layer's experts through `ExpertsInterface` (and, for fp8
checkpoints, `FP8ExpertsInterface`) by the name in `config._experts_implementation`. `register()`
adds "moekit" to both, so that

    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moekit")
    model.set_experts_implementation("moekit")        # or switch a loaded model

runs the experts of every layer through moekit.fused_experts, with no change to model code. Three
more names run a bf16 / f16 / f32 checkpoint's experts in fp8 W8A8, quantized from the module's
weights on the first call (like vLLM's online `quantization="fp8"`) and kept on the module:

    "moekit_fp8_tensor"   one scale per expert matrix, activations per tensor
    "moekit_fp8_channel"  one scale per output row, activations per token
    "moekit_fp8_block"    128 x 128 weight blocks, activations per 1 x 128 group

The kept copy is keyed on the weights' storage and version counter; an in-place change through
`param.data` bumps neither, so call `clear_cache(model)` after one.
`import moekit` calls register() when transformers is installed (MOEKIT_REGISTER_TRANSFORMERS=0
skips it). Model classes whose experts do not go through the interface (Llama-4's text MoE) take
the one-call module swap `swap_moe_blocks(model)` (moekit.MoELayer.from_hf_block per block).

What the experts forward does with the module's layout (use_experts_implementation flags):
  gate_up_proj [E, 2I, H] (gate rows, then up rows)  used as w1 without a copy
  is_transposed ([E, H, 2I] / [E, I, H])             a transposed copy, made per call
  is_concatenated False (gate, up rows interleaved)   a de-interleaved copy, made per call
  has_gate False (up_proj only)                      the g1u0 form: act(up)
  expert-parallel sentinel ids (>= num_experts)      skipped (-1)
Refused with NotImplementedError naming the feature: expert biases, post-expert norms, a custom
_apply_gate (clamped / soft-capped SwiGLU), static fp8 activation scales, fp4 experts. With
gradients needed (training) the call falls back to transformers' own grouped_mm path, which has
autograd: moekit's ops have no backward, and a silent wrong gradient is never an option.
Tests: tests/python/test_hf_experts.py. Docs: docs/python.md ("transformers").
"""

from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import torch
from torch import nn

from .api import fused_experts

NAME = "moekit"
#: Model classes whose experts transformers does not route through ExpertsInterface (swap these).
UNREACHED_BLOCKS = ("Llama4TextMoe",)
#: experts_implementation name -> moekit.MoELayer quant scheme (None: the weights as they are).
SCHEMES = {NAME: None, NAME + "_fp8_tensor": "fp8_per_tensor", NAME + "_fp8_channel": "fp8_per_row",
           NAME + "_fp8_block": "fp8_block"}
#: transformers versions the parity tests ran against (tests/python/test_hf_experts.py).
TESTED_TRANSFORMERS = ((5, 17), (5, 24))

_registered = False


def _version_tuple(v: str) -> Tuple[int, int]:
    parts = v.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def register() -> None:
    """Adds "moekit" to transformers' ExpertsInterface and FP8ExpertsInterface (idempotent).
    ImportError when transformers has no experts interface (transformers < 5)."""
    global _registered
    if _registered:
        return
    import transformers
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:
        raise ImportError(f"moekit.hf: transformers {transformers.__version__} has no ExpertsInterface "
                          "(transformers >= 5.17 needed)") from e
    v = _version_tuple(transformers.__version__)
    if not (TESTED_TRANSFORMERS[0] <= v <= TESTED_TRANSFORMERS[1]):
        warnings.warn(f"moekit.hf: transformers {transformers.__version__} is outside the tested range "
                      f"{'.'.join(map(str, TESTED_TRANSFORMERS[0]))}..{'.'.join(map(str, TESTED_TRANSFORMERS[1]))}",
                      stacklevel=2)
    for name, quant in SCHEMES.items():
        ExpertsInterface.register(name, experts_forward if quant is None else _quantized_forward(quant))
    try:
        from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
    except ImportError:
        FP8ExpertsInterface = None
    if FP8ExpertsInterface is not None:
        FP8ExpertsInterface.register(NAME, fp8_experts_forward)
    _registered = True


def register_if_installed() -> None:
    """register() where transformers is installed and MOEKIT_REGISTER_TRANSFORMERS is not 0; a
    transformers without the interface is left alone (register() says why when called)."""
    if os.environ.get("MOEKIT_REGISTER_TRANSFORMERS", "1") == "0":
        return
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        return
    try:
        register()
    except ImportError:
        pass  # a transformers without the interface: register() says why when called
    except Exception as e:  # a broken transformers install must not break `import moekit`
        warnings.warn(f"moekit.hf: could not register with transformers: {type(e).__name__}: {e}", stacklevel=2)


# ------------------------------------------------------------------------------ the forwards
def _refuse(module: nn.Module) -> None:
    """NotImplementedError naming the first feature of `module` that moekit's kernels lack."""
    from transformers.integrations import moe as hf_moe
    kind = type(module).__name__
    if getattr(module, "has_bias", False):
        raise NotImplementedError(f"moekit experts: {kind} has expert biases (has_bias), which moekit does not support")
    if getattr(module, "has_post_expert_norm", False):
        raise NotImplementedError(f"moekit experts: {kind} has a post-expert norm, which moekit does not support")
    gate = getattr(type(module), "_apply_gate", hf_moe._default_apply_gate)
    if getattr(module, "has_gate", True) and gate is not hf_moe._default_apply_gate:
        # FP8Experts defines its own _apply_gate; it is act(gate) * up unless one of these is set.
        fancy = [a for a in ("swiglu_alpha", "swiglu_limit", "gate_softcap", "up_softcap", "limit")
                 if getattr(module, a, None) is not None]
        if fancy or not _is_fp8_experts(module):
            what = ", ".join(fancy) if fancy else f"{type(module).__qualname__}._apply_gate"
            raise NotImplementedError(f"moekit experts: {kind} uses a custom gate ({what}: e.g. a clamped or "
                                      "soft-capped SwiGLU); moekit computes act(gate) * up only")


def _is_fp8_experts(module: nn.Module) -> bool:
    return any(c.__name__ == "FP8Experts" for c in type(module).__mro__)


def _activation(module: nn.Module) -> str:
    from .layer import activation_of
    act = module.act_fn
    # experts whose act_fn is a torch function, not a module (LFM2-MoE: F.silu)
    if act is torch.nn.functional.silu:
        return "silu"
    if act is torch.nn.functional.gelu:
        return "gelu"
    try:
        return activation_of(act)
    except ValueError as e:
        raise NotImplementedError(f"moekit experts: {type(module).__name__}: {e}") from None


def _needs_grad(module: nn.Module, *tensors: torch.Tensor) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in module.parameters(recurse=False))


def _fallback(module, hidden_states, top_k_index, top_k_weights, fp8: bool):
    """transformers' own grouped_mm experts (it has autograd), for calls that need gradients."""
    warnings.warn("moekit experts: gradients are needed (training); this call runs transformers' grouped_mm "
                  "experts instead (moekit's ops have no backward)", stacklevel=3)
    if fp8:
        from transformers.integrations.finegrained_fp8 import fp8_grouped_mm_experts_forward as fwd
    else:
        from transformers.integrations.moe import grouped_mm_experts_forward as fwd
    return fwd(module, hidden_states, top_k_index, top_k_weights)


def _plain(module: nn.Module, gate_up: torch.Tensor, down: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(w1 [E, N, H], w2 [E, H, I]) in moekit's layout: the module's own tensors where they already
    are (no copy), else a transposed / de-interleaved copy made for this call. NOTE: not cached on
    the module: an in-place update through param.data (weight loaders, PEFT merges) leaves the
    version counter alone, so no cheap key can tell that a kept copy went stale."""
    transposed = getattr(module, "is_transposed", False)
    interleaved = not getattr(module, "is_concatenated", True) and getattr(module, "has_gate", True)
    if not transposed and not interleaved and gate_up.is_contiguous() and down.is_contiguous():
        return gate_up, down
    w1, w2 = gate_up, down
    if transposed:
        w1, w2 = w1.transpose(1, 2), w2.transpose(1, 2)
    if interleaved:  # rows gate0, up0, gate1, up1, ... -> gate rows, then up rows
        w1 = torch.cat([w1[:, 0::2], w1[:, 1::2]], dim=1)
    return w1.contiguous(), w2.contiguous()


def _ids(module: nn.Module, top_k_index: torch.Tensor) -> torch.Tensor:
    """Expert-parallel sentinels (ids >= the local expert count) become -1: moekit skips them."""
    if getattr(module, "_is_expert_parallel", False):
        return torch.where(top_k_index >= module.num_experts, torch.full_like(top_k_index, -1), top_k_index)
    return top_k_index


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """ExpertsInterface entry: hidden_states [T, H], top_k_index / top_k_weights [T, k] -> [T, H]."""
    _refuse(self)
    activation = _activation(self)  # refused alike whether or not gradients are needed
    if _needs_grad(self, hidden_states, top_k_weights):
        return _fallback(self, hidden_states, top_k_index, top_k_weights, fp8=False)
    gate_up = (self.gate_up_proj if getattr(self, "has_gate", True) else self.up_proj).detach()
    w1, w2 = _plain(self, gate_up, self.down_proj.detach())
    x = hidden_states if hidden_states.dtype == w1.dtype else hidden_states.to(w1.dtype)
    out = fused_experts(x, w1, w2, top_k_weights, _ids(self, top_k_index), activation=activation)
    return out.to(hidden_states.dtype)


_BLOCK = (128, 128)


def _quantized_forward(quant: str):
    """The ExpertsInterface entry of one online fp8 scheme (SCHEMES)."""

    def forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        _refuse(self)
        activation = _activation(self)
        if _needs_grad(self, hidden_states, top_k_weights):
            return _fallback(self, hidden_states, top_k_index, top_k_weights, fp8=False)
        from .layer import fp8_experts_kwargs
        w1, s1, w2, s2 = _fp8_weights(self, quant)
        x = hidden_states if hidden_states.dtype in (torch.bfloat16, torch.float16) else hidden_states.to(torch.bfloat16)
        out = fused_experts(x, w1, w2, top_k_weights, _ids(self, top_k_index), activation=activation,
                            **fp8_experts_kwargs(quant, _BLOCK, s1, s2))
        return out.to(hidden_states.dtype)

    forward.__name__ = f"moekit_{quant}_experts_forward"
    return forward


def _fp8_weights(module: nn.Module, quant: str):
    """(w1, w1_scale, w2, w2_scale) of `module` quantized per `quant`, made once and kept on the
    module under a key of the source weights' storage, version, shape and device."""
    from .layer import quantize_experts
    gate_up = (module.gate_up_proj if getattr(module, "has_gate", True) else module.up_proj).detach()
    down = module.down_proj.detach()
    key = (quant,) + tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device)) for t in (gate_up, down))
    kept = getattr(module, "_moekit_fp8", None)
    if kept is not None and kept[0] == key:
        return kept[1]
    made = quantize_experts(*_plain(module, gate_up, down), quant, _BLOCK)
    module._moekit_fp8 = (key, made)
    return made


def clear_cache(model: nn.Module) -> int:
    """Drops every fp8 copy the moekit_fp8_* implementations kept on `model`'s experts modules
    (after an in-place weight change through param.data); returns how many."""
    n = 0
    for m in model.modules():
        if getattr(m, "_moekit_fp8", None) is not None:
            m._moekit_fp8 = None
            n += 1
    return n


def _fp8_scales(module: nn.Module, w1: torch.Tensor, s1: torch.Tensor, w2: torch.Tensor,
                s2: torch.Tensor) -> Tuple[Optional[Tuple[int, int]], torch.Tensor, torch.Tensor]:
    """(block_shape or None for per-tensor, w1_scale, w2_scale) in moekit's form, f32."""
    block = getattr(module, "block_size", None)
    s1, s2 = s1.detach().float(), s2.detach().float()
    if block is None:
        if s1[0].numel() != 1 or s2[0].numel() != 1:
            raise NotImplementedError(f"moekit experts: fp8 scales of shape {list(s1.shape)} without a block size")
        return None, s1.reshape(-1).contiguous(), s2.reshape(-1).contiguous()
    bn, bk = int(block[0]), int(block[1])
    E, N, H = w1.shape
    want = (E, -(-N // bn), -(-H // bk))
    if tuple(s1.shape) != want:
        # transformers keeps >= 2 scale rows for gate_up (one per half) even when 2I < bn.
        raise NotImplementedError(f"moekit experts: w1 block scales {list(s1.shape)} are not [E, ceil(2I/{bn}), "
                                  f"ceil(H/{bk})] = {list(want)} (2I < block size)")
    return (bn, bk), s1.contiguous(), s2.contiguous()


def fp8_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """FP8ExpertsInterface entry: fp8 e4m3 experts with block (or per-tensor) scales, activations
    quantized dynamically (per 1 x block_k group, or per token), as transformers' fp8 path does."""
    _refuse(self)
    if getattr(self, "activation_scheme", "dynamic") != "dynamic":
        raise NotImplementedError("moekit experts: fp8 activation_scheme='static' is not supported (dynamic only)")
    gated = getattr(self, "has_gate", True)
    w1 = self.gate_up_proj if gated else self.up_proj
    s1 = self.gate_up_proj_scale_inv if gated else self.up_proj_scale_inv
    if w1.dtype != torch.float8_e4m3fn:
        raise NotImplementedError(f"moekit experts: expert weights of dtype {w1.dtype} (fp8 e4m3fn only; no fp4)")
    activation = _activation(self)
    block, w1_scale, w2_scale = _fp8_scales(self, w1, s1, self.down_proj, self.down_proj_scale_inv)
    if _needs_grad(self, hidden_states, top_k_weights):
        return _fallback(self, hidden_states, top_k_index, top_k_weights, fp8=True)
    x = hidden_states if hidden_states.dtype in (torch.bfloat16, torch.float16) else hidden_states.to(torch.bfloat16)
    out = fused_experts(x, w1.detach(), self.down_proj.detach(), top_k_weights, _ids(self, top_k_index),
                        activation=activation, use_fp8_w8a8=True, block_shape=block, w1_scale=w1_scale,
                        w2_scale=w2_scale)
    return out.to(hidden_states.dtype)


# ------------------------------------------------------------------- module swap (Llama-4)
def swap_moe_blocks(model: nn.Module, quant: Optional[str] = None, only: Optional[Tuple[str, ...]] = None) -> int:
    """Replaces every MoE block that moekit.MoELayer.from_hf_block knows (Llama-4's Llama4TextMoe,
    Mixtral, Qwen3-MoE, DeepSeek-V3) by a MoELayer holding the same weights; returns how many.
    For model classes whose experts do not go through transformers' ExpertsInterface. `quant`: a
    MoELayer scheme (fp8_per_tensor, fp8_per_row, fp8_block) or an experts_implementation name of
    SCHEMES; `only`: block class names to swap (default: all known)."""
    from .layer import _HF_BLOCKS, MoELayer
    quant = SCHEMES.get(quant, quant)
    kinds = set(only) if only is not None else set(_HF_BLOCKS)
    swaps = [(name, m) for name, m in model.named_modules() if type(m).__name__ in _HF_BLOCKS.keys() & kinds]
    for name, block in swaps:
        layer = MoELayer.from_hf_block(block, quant=quant)
        if type(block).__name__ == "Llama4TextMoe":
            layer = _Llama4Output(layer)
        model.set_submodule(name, layer)
    return len(swaps)


class _Llama4Output(nn.Module):
    """Llama4TextMoe returns (out, router_logits) with out [T, H]; MoELayer returns out only."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states: torch.Tensor):
        return self.layer.forward_with_logits(hidden_states.reshape(-1, hidden_states.shape[-1]))
