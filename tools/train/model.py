"""The three tiny MoE decoder models and their checkpoint format: the PyTorch reference that the C++
model runner is compared against, written to be a checkpoint of a real transformers architecture.

One decoder layout for all three (pre-norm, RMSNorm, attention with RoPE, an MoE block in every
layer, untied LM head); they differ in the MoE block, one per routing family of SPEC 7
(docs/spec.md), and in the attention each architecture uses:
  - mixtral  (MixtralForCausalLM): grouped-query attention, RoPE rotate-half pairs (i, i + d/2);
             p = softmax(router logits); top-k of p; renormalize; y = sum w * E(x).
  - deepseek (DeepseekV3ForCausalLM): multi-head latent attention (MLA, no q LoRA): q = q_proj x per
             head [q_nope | q_rot]; [c | k_rot] = kv_a_proj_with_mqa x; [k_nope | v] per head =
             kv_b_proj rmsnorm(c); one k_rot shared by every head; RoPE on the rot parts in
             interleaved pairs (2i, 2i+1). MoE: s = sigmoid(logits); b = s + e_score_correction_bias
             (selection only); group score = sum of the top-2 b of each group; keep the topk_group
             best groups (others -inf); ids = top-k of b; w = s[ids] renormalized, then times
             routed_scaling_factor; plus one shared expert (weight 1).
  - llama4   (Llama4ForCausalLM, text): grouped-query attention, RoPE in interleaved pairs (2i, 2i+1)
             (transformers multiplies complex pairs), no QK-norm, no NoPE or chunked layers;
             top-1 of the raw logits; w = sigmoid(logit); the weight multiplies the expert INPUT:
             y = E(w * x), no weight at the end; plus a shared expert.
Experts are SwiGLU: down(silu(gate x) * up x). Routing runs in f32 (autocast off).

The MoE forward is written the straightforward way -- a loop over experts gathering their tokens --
so it reads as the specification; nothing here is optimised.

Tensor names and config.json keys are transformers' own (model_type mixtral, deepseek_v3,
llama4_text): `AutoModelForCausalLM.from_pretrained(models/<name>)` loads each checkpoint unchanged,
and tools/train/test_train.py checks that its logits equal this reference's. The full list of names
and shapes is in docs/models.md.
"""

import json
import os
import struct
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FAMILIES = ("mixtral", "deepseek", "llama4")
MOE_ATTR = {"mixtral": "block_sparse_moe", "deepseek": "mlp", "llama4": "feed_forward"}
MODEL_TYPE = {"mixtral": "mixtral", "deepseek": "deepseek_v3", "llama4": "llama4_text"}
ARCHITECTURE = {"mixtral": "MixtralForCausalLM", "deepseek": "DeepseekV3ForCausalLM", "llama4": "Llama4ForCausalLM"}


@dataclass
class ModelConfig:
    name: str
    family: str                       # one of FAMILIES
    vocab_size: int = 99              # = len(tokenizer)
    hidden_size: int = 256            # H
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2      # GQA: query head h reads kv head h // (heads / kv_heads)
    head_dim: int = 64                # mixtral, llama4 (deepseek: qk_nope_head_dim + qk_rope_head_dim)
    kv_lora_rank: int = 128           # deepseek MLA: the compressed kv width R
    qk_nope_head_dim: int = 32        # deepseek MLA: per-head q/k dims without RoPE
    qk_rope_head_dim: int = 32        # deepseek MLA: per-head q/k dims with RoPE (k_rot shared by heads)
    v_head_dim: int = 64              # deepseek MLA: per-head value dims
    num_experts: int = 8              # routed experts E
    num_experts_per_tok: int = 2      # k
    moe_intermediate_size: int = 128  # I of a routed expert
    shared_expert: bool = False       # one shared expert of size moe_intermediate_size
    n_group: int = 1                  # deepseek: expert groups
    topk_group: int = 1               # deepseek: groups kept per token
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2

    def validate(self) -> None:
        assert self.family in FAMILIES, self.family
        assert self.num_attention_heads % self.num_key_value_heads == 0
        assert self.head_dim % 2 == 0 and self.qk_rope_head_dim % 2 == 0
        if self.family == "deepseek":
            assert self.num_key_value_heads == self.num_attention_heads, "MLA expands k and v per head"
        assert 1 <= self.num_experts_per_tok <= self.num_experts
        if self.family == "deepseek":
            assert self.num_experts % self.n_group == 0 and self.topk_group <= self.n_group
            assert self.num_experts_per_tok <= self.topk_group * (self.num_experts // self.n_group)
        if self.family == "llama4":
            assert self.num_experts_per_tok == 1, "llama4 routing is top-1"

    def hf_config(self) -> Dict:
        """The config.json of the checkpoint: transformers' keys of the family's architecture, with
        every feature the reference does not implement switched off explicitly."""
        c = {
            "architectures": [ARCHITECTURE[self.family]], "model_type": MODEL_TYPE[self.family],
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
            "pad_token_id": self.pad_token_id, "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id, "num_experts_per_tok": self.num_experts_per_tok,
            "initializer_range": 0.02, "dtype": "bfloat16", "use_cache": True,
        }
        if self.family == "mixtral":
            c.update({"head_dim": self.head_dim, "intermediate_size": self.moe_intermediate_size,
                      "num_local_experts": self.num_experts, "sliding_window": None, "output_router_logits": False,
                      "router_aux_loss_coef": 0.01, "router_jitter_noise": 0.0})
        elif self.family == "deepseek":
            c.update({"moe_intermediate_size": self.moe_intermediate_size, "n_routed_experts": self.num_experts,
                      "n_shared_experts": 1 if self.shared_expert else 0, "n_group": self.n_group,
                      "topk_group": self.topk_group, "norm_topk_prob": True,
                      "routed_scaling_factor": self.routed_scaling_factor, "first_k_dense_replace": 0,
                      "intermediate_size": self.moe_intermediate_size, "q_lora_rank": None,
                      "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
                      "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim,
                      "rope_interleave": True, "num_nextn_predict_layers": 0})
        else:
            n = self.num_hidden_layers
            c.update({"head_dim": self.head_dim, "intermediate_size": self.moe_intermediate_size,
                      "intermediate_size_mlp": self.moe_intermediate_size, "num_local_experts": self.num_experts,
                      "interleave_moe_layer_step": 1, "moe_layers": list(range(n)), "use_qk_norm": False,
                      "no_rope_layers": [1] * n, "layer_types": ["full_attention"] * n,
                      # unused by full-attention layers, but transformers 5.17 wants a value
                      "attention_chunk_size": 8192, "attn_temperature_tuning": False,
                      "output_router_logits": False, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0})
        return dict(sorted(c.items()))

    @staticmethod
    def from_hf_config(name: str, c: Dict) -> "ModelConfig":
        family = {v: k for k, v in MODEL_TYPE.items()}[c["model_type"]]
        rope = c.get("rope_parameters") or {"rope_theta": c["rope_theta"]}
        common = dict(name=name, family=family, vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                      num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
                      num_key_value_heads=c["num_key_value_heads"],
                      num_experts_per_tok=c["num_experts_per_tok"], rms_norm_eps=c["rms_norm_eps"],
                      rope_theta=rope["rope_theta"], max_position_embeddings=c["max_position_embeddings"],
                      pad_token_id=c["pad_token_id"], bos_token_id=c["bos_token_id"], eos_token_id=c["eos_token_id"])
        if family == "mixtral":
            return ModelConfig(**common, head_dim=c["head_dim"], num_experts=c["num_local_experts"],
                               moe_intermediate_size=c["intermediate_size"])
        if family == "deepseek":
            return ModelConfig(**common, num_experts=c["n_routed_experts"], moe_intermediate_size=c["moe_intermediate_size"],
                               shared_expert=c["n_shared_experts"] == 1, n_group=c["n_group"],
                               topk_group=c["topk_group"], routed_scaling_factor=c["routed_scaling_factor"],
                               head_dim=c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
                               kv_lora_rank=c["kv_lora_rank"], qk_nope_head_dim=c["qk_nope_head_dim"],
                               qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"])
        return ModelConfig(**common, head_dim=c["head_dim"], num_experts=c["num_local_experts"],
                           moe_intermediate_size=c["intermediate_size"], shared_expert=True)


# The bundled models. Sizes: H and I multiples of 128 (every fp8 scheme of the library applies,
# 128x128 blocks included) and all three in bf16 under the 30 MB budget of the repository.
PRESETS = {
    "mixtral-tiny": ModelConfig("mixtral-tiny", "mixtral", num_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=128),
    "deepseek-v3-tiny": ModelConfig("deepseek-v3-tiny", "deepseek", num_key_value_heads=4, num_experts=8,
                                    num_experts_per_tok=2, moe_intermediate_size=128, shared_expert=True, n_group=4, topk_group=2,
                                    routed_scaling_factor=2.5, rms_norm_eps=1e-6),
    "llama4-tiny": ModelConfig("llama4-tiny", "llama4", num_hidden_layers=3, num_experts=4, num_experts_per_tok=1,
                               moe_intermediate_size=256, shared_expert=True),
}


def smoke_config(cfg: ModelConfig) -> ModelConfig:
    """A few-second CPU variant of a preset (same family and routing, tiny sizes)."""
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 moe_intermediate_size=64, num_experts=4)
    if cfg.family == "deepseek":
        small.update(n_group=2, topk_group=1, num_experts_per_tok=2, num_key_value_heads=2, kv_lora_rank=32,
                     qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32)
    return replace(cfg, name=cfg.name + "-smoke", **small)


# ---- building blocks ----------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(seq_len: int, dim: int, theta: float, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, dim/2] of angle p * inv_freq[i], inv_freq[i] = theta^(-2i/dim) (f32, as
    transformers' default RoPE computes them)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim)
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotates pairs of the last dim of x [..., S, d] by their angles: rotate-half pairs (i, i + d/2)
    (Llama, Mixtral) or interleaved pairs (2i, 2i+1) (Llama-4's complex product, DeepSeek-V3's
    rope_interleave); the output keeps the input's layout."""
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention (mixtral: rotate-half RoPE; llama4: interleaved RoPE)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.interleaved = cfg.family == "llama4"
        self.q_proj = nn.Linear(cfg.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin, self.interleaved), apply_rope(k, cos, sin, self.interleaved)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(head_dim)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.nh * self.hd))


class MLAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention without q LoRA, in transformers' names."""

    KV_NORM_EPS = 1e-6  # transformers builds kv_a_layernorm with its default eps, not rms_norm_eps

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nh = cfg.num_attention_heads
        self.dn, self.dr, self.dv, self.r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        self.q_proj = nn.Linear(cfg.hidden_size, self.nh * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.r + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, self.KV_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.r, self.nh * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(self.nh * self.dv, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.nh, self.dn + self.dr).transpose(1, 2)
        q_nope, q_rot = q.split([self.dn, self.dr], dim=-1)
        c, k_rot = self.kv_a_proj_with_mqa(x).split([self.r, self.dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, s, self.nh, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        q_rot = apply_rope(q_rot, cos, sin, True)
        k_rot = apply_rope(k_rot[:, None], cos, sin, True).expand(b, self.nh, s, self.dr)
        q = torch.cat([q_nope, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot], dim=-1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(dn + dr)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.nh * self.dv))


class SwiGLU(nn.Module):
    """An expert with Llama/DeepSeek names: down_proj(silu(gate_proj x) * up_proj x)."""

    def __init__(self, h: int, i: int):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    """Mixtral's expert names: w2(silu(w1 x) * w3 x) (w1 gate, w3 up, w2 down)."""

    def __init__(self, h: int, i: int):
        super().__init__()
        self.w1 = nn.Linear(h, i, bias=False)
        self.w2 = nn.Linear(i, h, bias=False)
        self.w3 = nn.Linear(h, i, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Llama4Experts(nn.Module):
    """Llama-4's fused expert tensors: gate_up_proj [E, H, 2I] (x @ it gives [gate | up]) and
    down_proj [E, I, H] (a @ it)."""

    def __init__(self, e: int, h: int, i: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
        self.down_proj = nn.Parameter(torch.empty(e, i, h))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.gate_up_proj[e].to(x.dtype)).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.down_proj[e].to(x.dtype)


# ---- the MoE block: routing per family, then the loop over experts --------------------------------

class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        if cfg.family == "mixtral":
            self.gate = nn.Linear(h, e, bias=False)
            self.experts = nn.ModuleList(MixtralExpert(h, i) for _ in range(e))
        elif cfg.family == "deepseek":
            self.gate = nn.Linear(h, e, bias=False)
            # NOTE: a buffer, not a parameter: DeepSeek-V3's auxiliary-loss-free balancing moves it by
            # a fixed step against each expert's load (update_bias), never by gradient.
            self.gate.register_buffer("e_score_correction_bias", torch.zeros(e))
            self.experts = nn.ModuleList(SwiGLU(h, i) for _ in range(e))
            self.shared_experts = SwiGLU(h, i)
        else:
            self.router = nn.Linear(h, e, bias=False)
            self.experts = Llama4Experts(e, h, i)
            self.shared_expert = SwiGLU(h, i)
        self.aux_loss: Optional[torch.Tensor] = None   # load-balancing loss of the last training forward
        self.load: Optional[torch.Tensor] = None       # [E] tokens per expert of the last forward

    def router_weight(self) -> torch.Tensor:
        return (self.router if self.cfg.family == "llama4" else self.gate).weight

    def route(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """logits [T, E] f32 -> (ids [T, k] int64, weights [T, k] f32), per the family's rule."""
        cfg = self.cfg
        k = cfg.num_experts_per_tok
        if cfg.family == "mixtral":
            p = torch.softmax(logits, dim=-1)
            w, ids = torch.topk(p, k, dim=-1)
            return ids, w / w.sum(dim=-1, keepdim=True)
        if cfg.family == "deepseek":
            s = torch.sigmoid(logits)
            b = s + self.gate.e_score_correction_bias.float()
            t, e = b.shape
            grouped = b.view(t, cfg.n_group, e // cfg.n_group)
            group_score = grouped.topk(min(2, e // cfg.n_group), dim=-1).values.sum(dim=-1)
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
            b = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(t, e)
            ids = b.topk(k, dim=-1).indices
            w = s.gather(1, ids)
            w = w / w.sum(dim=-1, keepdim=True)
            return ids, w * cfg.routed_scaling_factor
        top, ids = torch.topk(logits, 1, dim=-1)
        return ids, torch.sigmoid(top)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.family == "llama4":
            return self.experts.expert(e, x)
        return self.experts[e](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        cfg = self.cfg
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router_weight().float())
            ids, w = self.route(logits)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(cfg.num_experts):
            tok, slot = torch.where(ids == e)
            if tok.numel() == 0:
                continue
            we = w[tok, slot, None]
            if cfg.family == "llama4":   # router weight on the expert input, none at the end
                y = self.expert(e, (x[tok].float() * we).to(x.dtype)).float()
            else:
                y = self.expert(e, x[tok]).float() * we
            out.index_add_(0, tok, y)
        if cfg.family == "deepseek":
            out += self.shared_experts(x).float()
        elif cfg.family == "llama4":
            out += self.shared_expert(x).float()
        self.load = torch.bincount(ids.flatten(), minlength=cfg.num_experts).detach()
        if self.training and cfg.family != "deepseek":
            # Switch-style balancing loss E * sum_e f_e * P_e (f: share of routed slots, P: mean softmax).
            p = torch.softmax(logits, dim=-1).mean(dim=0)
            f = self.load.float() / ids.numel()
            self.aux_loss = cfg.num_experts * (f * p).sum()
        return out.to(x.dtype)

    @torch.no_grad()
    def update_bias(self, step: float) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing: bias += step * sign(mean load - load)."""
        if self.cfg.family == "deepseek" and self.load is not None:
            load = self.load.float()
            self.gate.e_score_correction_bias += step * torch.sign(load.mean() - load)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MLAttention(cfg) if cfg.family == "deepseek" else Attention(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.moe_attr = MOE_ATTR[cfg.family]
        setattr(self, self.moe_attr, MoE(cfg))

    @property
    def moe(self) -> MoE:
        return getattr(self, self.moe_attr)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.moe(h.reshape(-1, h.shape[-1])).view(h.shape)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MoeForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def moe_blocks(self) -> List[MoE]:
        return [layer.moe for layer in self.model.layers]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] -> logits [B, S, vocab] (f32). Positions are 0..S-1 in every row."""
        cfg = self.cfg
        rope_dim = cfg.qk_rope_head_dim if cfg.family == "deepseek" else cfg.head_dim  # the rotated dims
        cos, sin = rope_cos_sin(ids.shape[1], rope_dim, cfg.rope_theta, ids.device)  # once, for every layer
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x)).float()


# ---- checkpoint I/O -----------------------------------------------------------------------------

_ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int32: "I32"}
_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    u8 = t.detach().cpu().contiguous().view(torch.uint8).flatten()
    try:
        return u8.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch built without numpy
        return bytes(u8.tolist())


def write_safetensors(path: str, tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> None:
    """The safetensors format written directly: 8-byte little-endian header length, the JSON header
    (padded with spaces to a multiple of 8), then the tensors' bytes in name order."""
    header: Dict[str, Dict] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs, at = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = _tensor_bytes(t)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + e])
        out[name] = torch.frombuffer(raw, dtype=_ST_TORCH[v["dtype"]]).reshape(v["shape"]) if raw else \
            torch.zeros(v["shape"], dtype=_ST_TORCH[v["dtype"]])
    return out


def save_tensors(path: str, tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> None:
    """With the safetensors package when it is installed, else write_safetensors (same format)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        write_safetensors(path, tensors, metadata)
        return
    save_file(tensors, path, metadata=metadata)


def checkpoint_tensors(model: MoeForCausalLM) -> Dict[str, torch.Tensor]:
    """The state dict as stored: bf16, except the DeepSeek correction bias (f32, selection only)."""
    out = {}
    for name, t in model.state_dict().items():
        out[name] = t.float() if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    return out


def generation_config(cfg: ModelConfig) -> Dict:
    """generation_config.json: greedy decoding that stops at eos (what the task's metric uses)."""
    return {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
            "do_sample": False}


def save_model(model: MoeForCausalLM, out_dir: str, tokenizer) -> None:
    """A transformers model folder: model.safetensors, config.json, generation_config.json and the
    tokenizer's tokenizer.json + tokenizer_config.json (tokenizer: a tokenizer.CharTokenizer)."""
    os.makedirs(out_dir, exist_ok=True)
    save_tensors(os.path.join(out_dir, "model.safetensors"), checkpoint_tensors(model), {"format": "pt"})
    for name, obj in (("config.json", model.cfg.hf_config()), ("generation_config.json", generation_config(model.cfg))):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    tokenizer.save_pretrained(out_dir, model.cfg.max_position_embeddings)


def load_model(model_dir: str, dtype: torch.dtype = torch.float32) -> MoeForCausalLM:
    """A model from a saved directory; weights converted to `dtype` (f32: bf16 values, f32 compute)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = ModelConfig.from_hf_config(os.path.basename(os.path.normpath(model_dir)), json.load(f))
    model = MoeForCausalLM(cfg)
    state = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.to(dtype).eval()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

