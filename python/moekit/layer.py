"""moekit.MoELayer: a vLLM-style MoE layer (router + routed experts + optional shared expert).

The layer owns the router weight, the expert weights prepared ONCE at load time (stacked to
w1 [E, 2I, H] = gate rows then up rows, w2 [E, H, I]; optionally quantized to fp8 per tensor, per
row or in 128 x 128 blocks) and an optional shared expert. forward(x) computes the router logits
with torch, then calls the moekit functions (fused_topk / grouped_topk / sigmoid_topk, then
fused_experts), then adds the shared expert. Routing families:
  "softmax_topk"        Mixtral, Qwen3-MoE: softmax top-k, optional renormalization (SPEC 1.1)
  "grouped_sigmoid"     DeepSeek-V3: sigmoid + correction bias, n_group / topk_group, renormalize,
                        routed_scaling_factor (applied once, in the router), f32 router GEMM (SPEC 1.2)
  "sigmoid_top1_input"  Llama-4: sigmoid top-1 on the raw logits, weight on the expert INPUT (SPEC 1.3, 3.4)
Weights come from per-expert checkpoint tensors (load_experts: w1 = gate_proj, w3 = up_proj,
w2 = down_proj), fused ones (load_fused_experts: gate_up_proj, down_proj), a checkpoint state
dict (load_checkpoint) or a Hugging Face transformers block (MoELayer.from_hf_block).
Test: tests/python/test_layer_hf.py (against transformers' Mixtral, Qwen3-MoE, DeepSeek-V3 and
Llama-4 blocks). Docs: docs/python_layer.md.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

try:
    from moekit.api import fused_experts, fused_topk, grouped_topk, quantize_fp8, sigmoid_topk
except ImportError:
    # NOTE: moekit.api (torch.ops.moekit dispatch, honouring MOEKIT_USE_FUSED_MOE) is built by the
    # extension; without it the layer runs the pure-torch reference, which has the same signatures.
    from moekit.reference import ref_fused_experts as fused_experts
    from moekit.reference import ref_fused_topk as fused_topk
    from moekit.reference import ref_grouped_topk as grouped_topk
    from moekit.reference import ref_quantize_fp8 as quantize_fp8
    from moekit.reference import ref_sigmoid_topk as sigmoid_topk

ROUTINGS = ("softmax_topk", "grouped_sigmoid", "sigmoid_top1_input")
QUANT_SCHEMES = (None, "fp8_per_tensor", "fp8_per_row", "fp8_block")
_TORCH_ACT = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
}

Weights = Union[torch.Tensor, Sequence[torch.Tensor]]


def _stack(w: Weights, name: str) -> torch.Tensor:
    """Per-expert tensors (a list) or an already stacked [E, ...] tensor -> one [E, ...] tensor."""
    if isinstance(w, torch.Tensor):
        if w.dim() != 3:
            raise ValueError(f"{name}: stacked expert weights must be 3-D [E, rows, cols], got {list(w.shape)}")
        return w
    if len(w) == 0:
        raise ValueError(f"{name}: no expert weights given")
    return torch.stack([t.detach() for t in w])


def quantize_experts(w1: torch.Tensor, w2: torch.Tensor, quant: str, block_shape: Sequence[int] = (128, 128)):
    """(q1, s1, q2, s2): w1 [E, N, K] and w2 in fp8 e4m3 with the scales of scheme `quant` (one of
    QUANT_SCHEMES): fp8_per_tensor [E] (one per expert matrix), fp8_per_row [E, N, 1],
    fp8_block [E, ceil(N / bn), ceil(K / bk)]."""
    if quant == "fp8_per_tensor":
        q1, s1 = zip(*(quantize_fp8(w, "per_tensor") for w in w1))
        q2, s2 = zip(*(quantize_fp8(w, "per_tensor") for w in w2))
        return torch.stack(q1), torch.cat(s1), torch.stack(q2), torch.cat(s2)
    if quant == "fp8_per_row":
        return quantize_fp8(w1, "per_row") + quantize_fp8(w2, "per_row")
    if quant == "fp8_block":
        return quantize_fp8(w1, "block", block=block_shape) + quantize_fp8(w2, "block", block=block_shape)
    raise ValueError(f"quant: must be one of {QUANT_SCHEMES[1:]}, got {quant!r}")


def fp8_experts_kwargs(quant: str, block_shape: Sequence[int], w1_scale: torch.Tensor, w2_scale: torch.Tensor) -> dict:
    """fused_experts' keyword arguments for experts made by quantize_experts(quant)."""
    kw = dict(use_fp8_w8a8=True, w1_scale=w1_scale, w2_scale=w2_scale)
    if quant == "fp8_per_row":
        kw["per_channel_quant"] = True
    elif quant == "fp8_block":
        kw["block_shape"] = list(block_shape)
    return kw


def activation_of(module: nn.Module) -> str:
    """moekit's name for a transformers / torch activation module (SiLU, GELU, GELU-tanh)."""
    name = type(module).__name__
    if name in ("SiLUActivation", "SiLU"):
        return "silu"
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "GELUPytorchTanh"):
        return "gelu_tanh"
    if name in ("GELUActivation", "GELU"):
        return "gelu_tanh" if getattr(module, "approximate", "none") == "tanh" else "gelu"
    raise ValueError(f"activation: {name} has no moekit equivalent (silu, gelu, gelu_tanh)")


class MoELayer(nn.Module):
    """Router + experts (+ shared expert) calling moekit's fused MoE functions.

    Buffers (the prepared weights; state_dict() saves them as they are used):
      gate_weight [E, H]  router weight (router_dtype, or the layer dtype)
      e_score_correction_bias [E] f32 (grouped_sigmoid only)
      w1 [E, 2I, H], w2 [E, H, I]  the layer dtype, or fp8 e4m3fn with w1_scale / w2_scale:
        fp8_per_tensor [E], fp8_per_row [E, N, 1], fp8_block [E, ceil(N/bn), ceil(K/bk)]
      shared_w1 [2Is, H], shared_w2 [H, Is]  the shared expert (shared_intermediate_size > 0)
    NOTE: move a prepared layer with .to(device) only: nn.Module.to(dtype) would also cast the fp8
    weights (fp8 dtypes count as floating point); build the layer in the dtype wanted instead.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 routing: str = "softmax_topk", renormalize: bool = True, n_group: int = 1, topk_group: int = 1,
                 routed_scaling_factor: float = 1.0, shared_intermediate_size: int = 0, activation: str = "silu",
                 router_dtype: Optional[torch.dtype] = None, quant: Optional[str] = None,
                 block_shape: Tuple[int, int] = (128, 128), dtype: torch.dtype = torch.bfloat16,
                 device: Optional[Union[str, torch.device]] = None):
        super().__init__()
        if routing not in ROUTINGS:
            raise ValueError(f"routing: must be one of {ROUTINGS}, got {routing!r}")
        if quant not in QUANT_SCHEMES:
            raise ValueError(f"quant: must be one of {QUANT_SCHEMES}, got {quant!r}")
        if activation not in _TORCH_ACT:
            raise ValueError(f"activation: must be one of {sorted(_TORCH_ACT)}, got {activation!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: must be in [1, {num_experts}], got {top_k}")
        if routing == "sigmoid_top1_input" and top_k != 1:
            raise ValueError(f"top_k: routing 'sigmoid_top1_input' puts the weight on the input and needs "
                             f"top_k == 1 (SPEC 3.4), got {top_k}")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.top_k = num_experts, top_k
        self.routing, self.renormalize = routing, renormalize
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.shared_intermediate_size = shared_intermediate_size
        self.activation, self.quant, self.block_shape = activation, quant, tuple(block_shape)
        self.dtype, self.router_dtype = dtype, router_dtype

        E, H, inter = num_experts, hidden_size, intermediate_size
        self.register_buffer("gate_weight", torch.zeros(E, H, dtype=router_dtype or dtype, device=device))
        bias = torch.zeros(E, dtype=torch.float32, device=device) if routing == "grouped_sigmoid" else None
        self.register_buffer("e_score_correction_bias", bias)
        self.register_buffer("w1", torch.zeros(E, 2 * inter, H, dtype=dtype, device=device))
        self.register_buffer("w2", torch.zeros(E, H, inter, dtype=dtype, device=device))
        self.register_buffer("w1_scale", None)
        self.register_buffer("w2_scale", None)
        shared = shared_intermediate_size
        self.register_buffer("shared_w1", torch.zeros(2 * shared, H, dtype=dtype, device=device) if shared else None)
        self.register_buffer("shared_w2", torch.zeros(H, shared, dtype=dtype, device=device) if shared else None)
        self._prepared = False

    # ------------------------------------------------------------ loading (done once)
    def load_experts(self, w1: Weights, w3: Weights, w2: Weights) -> "MoELayer":
        """Per-expert checkpoint weights: w1 = gate_proj [I, H], w3 = up_proj [I, H], w2 = down_proj
        [H, I] (lists of E tensors, or stacked [E, ...] tensors). Stacks and prepares them."""
        return self.load_fused_experts(torch.cat([_stack(w1, "w1"), _stack(w3, "w3")], dim=1), _stack(w2, "w2"))

    def load_fused_experts(self, gate_up: torch.Tensor, down: torch.Tensor) -> "MoELayer":
        """Fused weights gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I]."""
        E, H, inter = self.num_experts, self.hidden_size, self.intermediate_size
        if list(gate_up.shape) != [E, 2 * inter, H]:
            raise ValueError(f"gate_up: shape must be [{E}, {2 * inter}, {H}], got {list(gate_up.shape)}")
        if list(down.shape) != [E, H, inter]:
            raise ValueError(f"down: shape must be [{E}, {H}, {inter}], got {list(down.shape)}")
        dev = self.gate_weight.device
        w1 = gate_up.detach().to(device=dev, dtype=self.dtype).contiguous()
        w2 = down.detach().to(device=dev, dtype=self.dtype).contiguous()
        if self.quant is None:
            self.w1, self.w2 = w1, w2
        else:
            self.w1, self.w1_scale, self.w2, self.w2_scale = quantize_experts(w1, w2, self.quant, self.block_shape)
        self._prepared = True
        return self

    def load_router(self, weight: torch.Tensor, e_score_correction_bias: Optional[torch.Tensor] = None) -> "MoELayer":
        """Router weight [E, H] (and, for grouped_sigmoid, the selection bias [E])."""
        if list(weight.shape) != list(self.gate_weight.shape):
            raise ValueError(f"weight: shape must be {list(self.gate_weight.shape)}, got {list(weight.shape)}")
        self.gate_weight = weight.detach().to(self.gate_weight).clone()
        if e_score_correction_bias is not None:
            if self.e_score_correction_bias is None:
                raise ValueError(f"e_score_correction_bias: only used by routing 'grouped_sigmoid', "
                                 f"not {self.routing!r}")
            self.e_score_correction_bias = e_score_correction_bias.detach().to(self.e_score_correction_bias).clone()
        return self

    def load_shared_expert(self, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor) -> "MoELayer":
        """Shared expert weights gate_proj [Is, H], up_proj [Is, H], down_proj [H, Is]."""
        if self.shared_w1 is None:
            raise ValueError("gate_proj: this layer has no shared expert (shared_intermediate_size = 0)")
        w1 = torch.cat([gate_proj.detach(), up_proj.detach()], dim=0)
        if w1.shape != self.shared_w1.shape or down_proj.shape != self.shared_w2.shape:
            raise ValueError(f"shared expert: shapes must be gate/up {list(self.shared_w2.shape[::-1])}, down "
                             f"{list(self.shared_w2.shape)}, got {list(gate_proj.shape)} and {list(down_proj.shape)}")
        self.shared_w1 = w1.to(self.shared_w1).contiguous()
        self.shared_w2 = down_proj.detach().to(self.shared_w2).contiguous()
        return self

    def load_checkpoint(self, state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> "MoELayer":
        """Loads a checkpoint's MoE block: router `gate.weight` (or `router.weight`, plus
        `gate.e_score_correction_bias`), experts either per expert `experts.{e}.{w1|w3|w2}.weight`
        (Mixtral) / `experts.{e}.{gate_proj|up_proj|down_proj}.weight` (Qwen3, DeepSeek) or fused
        `experts.gate_up_proj` / `experts.down_proj`, and `shared_expert(s).{gate,up,down}_proj.weight`."""
        sd = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        router = sd.get("gate.weight", sd.get("router.weight"))
        if router is None:
            raise KeyError(f"state_dict: no {prefix}gate.weight or {prefix}router.weight")
        self.load_router(router, sd.get("gate.e_score_correction_bias"))
        if "experts.gate_up_proj" in sd:
            self.load_fused_experts(sd["experts.gate_up_proj"], sd["experts.down_proj"])
        else:
            names = ("w1", "w3", "w2") if "experts.0.w1.weight" in sd else ("gate_proj", "up_proj", "down_proj")
            per = [[sd[f"experts.{e}.{n}.weight"] for e in range(self.num_experts)] for n in names]
            self.load_experts(*per)
        for shared in ("shared_experts", "shared_expert"):
            if f"{shared}.gate_proj.weight" in sd:
                self.load_shared_expert(*(sd[f"{shared}.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")))
        return self

    # ------------------------------------------------------------ forward
    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router of x [T, H]: (logits [T, E], topk_weights f32 [T, k], topk_ids int32 [T, k])."""
        rdt = self.router_dtype or x.dtype
        logits = F.linear(x.to(rdt), self.gate_weight.to(rdt))
        if self.routing == "softmax_topk":
            w, ids, _ = fused_topk(x, logits, self.top_k, self.renormalize)
        elif self.routing == "grouped_sigmoid":
            w, ids = grouped_topk(x, logits, self.top_k, self.renormalize, self.n_group, self.topk_group,
                                  scoring_func="sigmoid", e_score_correction_bias=self.e_score_correction_bias,
                                  routed_scaling_factor=self.routed_scaling_factor)
        else:
            w, ids = sigmoid_topk(logits, self.top_k)
        return logits, w, ids

    def _quant_kwargs(self) -> dict:
        if self.quant is None:
            return {}
        return fp8_experts_kwargs(self.quant, self.block_shape, self.w1_scale, self.w2_scale)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [..., H] -> [..., H]: routed experts (+ shared expert)."""
        return self.forward_with_logits(hidden_states)[0]

    def forward_with_logits(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """forward(), and the router logits [T, E] it routed with (what transformers' blocks return)."""
        if not self._prepared:
            raise RuntimeError("MoELayer: no expert weights loaded (load_experts / load_fused_experts / "
                               "load_checkpoint / from_hf_block)")
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size)
        logits, w, ids = self.route(x)
        out = fused_experts(x, self.w1, self.w2, w, ids, activation=self.activation,
                            apply_router_weight_on_input=self.routing == "sigmoid_top1_input", **self._quant_kwargs())
        if self.shared_w1 is not None:
            gate, up = F.linear(x, self.shared_w1).chunk(2, dim=-1)
            out = out + F.linear(_TORCH_ACT[self.activation](gate) * up, self.shared_w2)
        return out.reshape(shape), logits

    def extra_repr(self) -> str:
        return (f"H={self.hidden_size}, I={self.intermediate_size}, E={self.num_experts}, k={self.top_k}, "
                f"routing={self.routing}, quant={self.quant}, shared_I={self.shared_intermediate_size}")

    # ------------------------------------------------------------ Hugging Face transformers blocks
    @classmethod
    def from_hf_block(cls, block: nn.Module, quant: Optional[str] = None,
                      block_shape: Tuple[int, int] = (128, 128)) -> "MoELayer":
        """A prepared MoELayer holding the weights of a transformers MoE block (same dtype, device):
        MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock, DeepseekV3MoE or Llama4TextMoe."""
        kind = type(block).__name__
        if kind not in _HF_BLOCKS:
            raise TypeError(f"block: {kind} is not supported; expected one of {sorted(_HF_BLOCKS)}")
        return _HF_BLOCKS[kind](cls, block, quant, tuple(block_shape))


def _hf_experts(experts: nn.Module) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """(gate_up [E, 2I, H], down [E, H, I], activation) of a transformers experts module: the fused
    3-D parameters of transformers >= 5 (or a ModuleList of per-expert MLPs of older versions)."""
    if hasattr(experts, "gate_up_proj"):
        return experts.gate_up_proj.detach(), experts.down_proj.detach(), activation_of(experts.act_fn)
    first = experts[0]
    names = ("w1", "w3", "w2") if hasattr(first, "w1") else ("gate_proj", "up_proj", "down_proj")
    gate, up, down = ([getattr(m, n).weight.detach() for m in experts] for n in names)
    act = getattr(first, "act_fn", None) or first.act
    return torch.cat([torch.stack(gate), torch.stack(up)], dim=1), torch.stack(down), activation_of(act)


def _new_layer(cls, gate_up, down, top_k, quant, block_shape, **kw) -> MoELayer:
    E, two_i, H = gate_up.shape
    return cls(H, two_i // 2, E, top_k, quant=quant, block_shape=block_shape, dtype=gate_up.dtype,
               device=gate_up.device, **kw)


def _from_softmax_block(cls, block, quant, block_shape) -> MoELayer:
    """Mixtral (always renormalizes) and Qwen3-MoE (norm_topk_prob)."""
    gate_up, down, act = _hf_experts(block.experts)
    renorm = bool(getattr(block.gate, "norm_topk_prob", True))
    layer = _new_layer(cls, gate_up, down, block.gate.top_k, quant, block_shape, routing="softmax_topk",
                       renormalize=renorm, activation=act)
    return layer.load_router(block.gate.weight).load_fused_experts(gate_up, down)


def _from_deepseek_v3(cls, block, quant, block_shape) -> MoELayer:
    gate_up, down, act = _hf_experts(block.experts)
    g, sh = block.gate, block.shared_experts
    # NOTE: DeepSeek-V3 computes the router GEMM in f32 (F.linear(x.float(), weight.float())).
    layer = _new_layer(cls, gate_up, down, g.top_k, quant, block_shape, routing="grouped_sigmoid",
                       renormalize=bool(g.norm_topk_prob), n_group=g.num_group, topk_group=g.topk_group,
                       routed_scaling_factor=float(g.routed_scaling_factor), activation=act,
                       shared_intermediate_size=sh.gate_proj.weight.shape[0], router_dtype=torch.float32)
    layer.load_router(g.weight, g.e_score_correction_bias).load_fused_experts(gate_up, down)
    return layer.load_shared_expert(sh.gate_proj.weight, sh.up_proj.weight, sh.down_proj.weight)


def _from_llama4(cls, block, quant, block_shape) -> MoELayer:
    ex, sh = block.experts, block.shared_expert
    # NOTE: Llama-4 stores experts transposed for bmm: gate_up_proj [E, H, 2I], down_proj [E, I, H].
    gate_up, down = ex.gate_up_proj.detach().transpose(1, 2), ex.down_proj.detach().transpose(1, 2)
    layer = _new_layer(cls, gate_up, down, block.top_k, quant, block_shape, routing="sigmoid_top1_input",
                       activation=activation_of(ex.act_fn), shared_intermediate_size=sh.gate_proj.weight.shape[0])
    layer.load_router(block.router.weight).load_fused_experts(gate_up, down)
    return layer.load_shared_expert(sh.gate_proj.weight, sh.up_proj.weight, sh.down_proj.weight)


_HF_BLOCKS = {
    "MixtralSparseMoeBlock": _from_softmax_block,
    "Qwen3MoeSparseMoeBlock": _from_softmax_block,
    "DeepseekV3MoE": _from_deepseek_v3,
    "Llama4TextMoe": _from_llama4,
}
