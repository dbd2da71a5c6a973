"""Parity of moekit.hf (the "moekit" experts implementation of transformers 5.x) against code
nobody here wrote: the model classes of the installed transformers, run with their own "eager"
experts (and, where they exist, transformers' grouped_mm / batched_mm experts), on small random
models built on the CPU.

  test_model_parity          every MoE model class moekit serves (MODELS): f32 logits within
                             1e-5 relative; bf16 logits, and each layer's bf16 experts output on
                             the same inputs, no further from f32 than eager bf16's (x 1.5);
                             greedy generate() identical in f32, and in bf16 up to the first step
                             where eager's top-2 logits are within bf16 noise
  test_from_pretrained       experts_implementation="moekit" through save / from_pretrained
  test_refused_*             what moekit cannot compute raises NotImplementedError naming it
  test_gradients_*           with gradients needed, transformers' grouped_mm runs (a warning) and
                             the gradients are eager's
  test_expert_parallel_*     expert-parallel sentinel ids contribute nothing
  test_layout_* / test_weight_update_*  transposed / interleaved / up-only experts, and weights
                             changed in place after a call (also through param.data). Interleaved
                             gate / up rows are checked against the module's own forward only:
                             transformers' grouped_mm reads is_concatenated nowhere (only a custom
                             _apply_gate, which moekit refuses, de-interleaves there)
  test_fp8_*                 transformers' FP8Experts (block scales) against a dequantized reference
  test_online_fp8_*          moekit_fp8_{tensor,channel,block}: bf16 experts quantized once, kept,
                             and refreshed (or cleared with clear_cache) after a weight change
  test_llama4_swap           moekit.hf.swap_moe_blocks on Llama-4 text
  test_compile               torch.compile of a model running "moekit"

moekit.hf.fused_experts is wrapped by a counter in the parity tests so that a "moekit" run that
silently fell back to transformers' code fails. Run with -s to see the measured agreement.
"""

from __future__ import annotations

import inspect
import math
import types
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
hf_moe = pytest.importorskip("transformers.integrations.moe",
                             reason="transformers < 5: no experts interface (transformers.integrations.moe)")
if not hasattr(hf_moe, "use_experts_implementation"):
    pytest.skip(f"transformers {transformers.__version__} has no use_experts_implementation", allow_module_level=True)

import moekit.hf as mhf  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

mhf.register()

VOCAB = 128
#: small-model settings, applied where the model's config has the attribute (config.to_dict()).
#: initializer_range 0.1 (not 0.02): with it the experts change the logits by O(1) relative, so a
#: wrong expert output cannot hide under the residual stream.
COMMON = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
              max_position_embeddings=256, num_local_experts=8, num_experts=8, n_routed_experts=8,
              num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0, n_group=2, topk_group=1,
              decoder_sparse_step=1, moe_layer_freq=1, mlp_only_layers=[], kv_lora_rank=16, q_lora_rank=16,
              qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, initializer_range=0.1, pad_token_id=0)
_MLA = dict(head_dim=8, qk_head_dim=16)  # DeepSeek-style attention: head_dim is the rope part
_HYBRID = dict(num_hidden_layers=4)      # hybrids (linear / sliding attention): one full-attention layer in 4
#: no bf16 generate() for these: transformers' reference PyTorch gated-delta-rule (flash-linear-
#: attention is not installed) takes ~7.5 s per bf16 generate on 2 CPU cores; f32 generate,
#: f32 and bf16 logits are still checked.
NO_BF16_GENERATE = {"qwen3_next", "qwen3_5_moe_text"}

#: model_type -> config overrides; every one served by moekit through ExpertsInterface.
MODELS = {
    "mixtral": {},
    "qwen2_moe": {},
    "qwen3_moe": {},
    "qwen3_next": _HYBRID,
    "qwen3_5_moe_text": _HYBRID,
    "deepseek_v2": _MLA,
    "deepseek_v3": _MLA,
    "glm4_moe": {},
    "glm4_moe_lite": _MLA,
    "olmoe": {},
    "flex_olmo": {},
    "ernie4_5_moe": {},
    "phimoe": {},
    "granitemoe": {},
    "granitemoeshared": {},
    "dots1": {},
    "hunyuan_v1_moe": {},
    "minimax": {},
    "minimax_m2": {},
    "jamba": dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1,
                  expert_layer_offset=0),
    "lfm2_moe": dict(num_hidden_layers=4, num_dense_layers=0,
                     layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "exaone_moe": _HYBRID,
    "cohere2_moe": _HYBRID,
    "afmoe": _HYBRID,
    "mimo_v2_flash": _HYBRID,
    "solar_open": {},
    "laguna": {},
    "aria_text": dict(intermediate_size=32, moe_num_experts=8, moe_topk=2, moe_num_shared_experts=1),  # transposed
}
GEN_TOKENS = 32
F32_REL = 1e-5


def _known(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return model_type in CONFIG_MAPPING_NAMES


def tiny_config(model_type: str, **over):
    defaults = AutoConfig.for_model(model_type).to_dict()
    kw = {k: v for k, v in COMMON.items() if k in defaults}
    kw.update(MODELS.get(model_type, {}))
    kw.update(over)
    return AutoConfig.for_model(model_type, **kw)


def tiny_model(model_type: str, seed: int = 0, **over) -> nn.Module:
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(model_type, **over)).eval()


def prompt(seed: int, batch: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def greedy(model: nn.Module, ids: torch.Tensor, impl: str):
    """(tokens [B, n], logits [n, B, V] f32) of a greedy generate() with experts `impl`."""
    model.set_experts_implementation(impl)
    gc = GenerationConfig(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False, eos_token_id=None,
                          pad_token_id=0, bos_token_id=None, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        out = model.generate(ids, generation_config=gc)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits).float()


def logits(model: nn.Module, ids: torch.Tensor, impl: str) -> torch.Tensor:
    model.set_experts_implementation(impl)
    with torch.no_grad():
        return model(ids).logits.float()


def rel_max(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max())


def first_true(mask: torch.Tensor, default: int) -> torch.Tensor:
    """[n, B] bool -> [B]: the first step where mask holds, or `default`."""
    steps = torch.arange(mask.shape[0]).unsqueeze(1).expand_as(mask)
    return torch.where(mask, steps, torch.full_like(steps, default)).min(dim=0).values


def experts_modules(model: nn.Module):
    """The modules made by use_experts_implementation (the decorator sets these attributes)."""
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_concatenated")]


def capture_experts_inputs(model: nn.Module, ids: torch.Tensor):
    """[(module, args, kwargs)] of every experts call of one forward of `model` (as it is set)."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, a, kw: seen.append((mod, a, kw)), with_kwargs=True)
             for m in experts_modules(model)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def layer_bf16_errors(model: nn.Module, ids: torch.Tensor):
    """Per experts call of a bf16 forward, on the same bf16 inputs: (|moekit - f32|, |eager - f32|)
    relative to |f32|, f32 = eager with the module and inputs in f32. Router flips cannot enter."""
    model.set_experts_implementation("eager")
    errors = []
    for module, args, kw in capture_experts_inputs(model, ids):
        with torch.no_grad():
            eager = module(*args, **kw).float()
            mine = mhf.experts_forward(module, *args, **kw).float()
            module.float()
            ref = module(*[a.float() if a.is_floating_point() else a for a in args],
                         **{k: v.float() if v.is_floating_point() else v for k, v in kw.items()}).float()
            module.to(torch.bfloat16)
        norm = float(ref.norm()) or 1.0
        errors.append((float((mine - ref).norm()) / norm, float((eager - ref).norm()) / norm))
    return errors


@pytest.fixture
def moekit_calls(monkeypatch):
    """Counts the moekit.fused_experts calls that moekit.hf makes (a list of their dtypes)."""
    calls = []
    real = mhf.fused_experts

    def counted(*args, **kwargs):
        calls.append(args[1].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(mhf, "fused_experts", counted)
    return calls


# ------------------------------------------------------------------ 1. model classes, end to end
@pytest.mark.parametrize("model_type", list(MODELS))
def test_model_parity(model_type, moekit_calls):
    if not _known(model_type):
        pytest.skip(f"transformers {transformers.__version__} has no model type {model_type!r}")
    model = tiny_model(model_type)
    ids = prompt(1)

    # f32 logits
    ref = logits(model, ids, "eager")
    assert not moekit_calls, "the eager run called moekit"
    got = logits(model, ids, "moekit")
    if not moekit_calls and not experts_modules(model):
        pytest.skip(f"transformers {transformers.__version__}: {type(model).__name__}'s experts do not go through "
                    "the experts interface in this version")
    assert moekit_calls, f"{type(model).__name__}: set_experts_implementation('moekit') never reached moekit"
    f32 = rel_max(got, ref)
    assert f32 <= F32_REL, f"f32 logits: max |moekit - eager| / max |eager| = {f32:.3g}"

    # f32 greedy generate
    tok_e, _ = greedy(model, ids, "eager")
    tok_m, _ = greedy(model, ids, "moekit")
    assert torch.equal(tok_m, tok_e), "f32 greedy generate differs"

    # bf16 logits: moekit's error (to the f32 logits) no worse than eager bf16's own
    model.to(torch.bfloat16)
    moekit_calls.clear()
    e16 = logits(model, ids, "eager")
    m16 = logits(model, ids, "moekit")
    assert moekit_calls and all(dt == torch.bfloat16 for dt in moekit_calls), moekit_calls
    err_e, err_m = float((e16 - ref).norm()), float((m16 - ref).norm())
    ratio = err_m / err_e if err_e else math.inf
    line = (f"\n[hf-parity] {model_type:17s} {type(model).__name__:30s} f32 max rel {f32:.1e} | bf16 rel "
            f"|err| moekit {err_m / float(ref.norm()):.4f} eager {err_e / float(ref.norm()):.4f} ratio "
            f"{ratio:.2f}, max |moekit - eager| {float((m16 - e16).abs().max()):.3f} (max |logit| "
            f"{float(ref.abs().max()):.2f}) | gen f32 {GEN_TOKENS}/{GEN_TOKENS}")
    assert err_m <= 1.5 * err_e + 1e-3 * float(ref.norm()), (
        f"bf16 logits: |moekit - f32| = {err_m:.4g}, |eager bf16 - f32| = {err_e:.4g}")
    # bf16 experts, layer by layer on the same inputs (the logits above also carry router flips)
    layer = layer_bf16_errors(model, ids)
    assert layer
    worst = max(layer, key=lambda e: e[0] / max(e[1], 1e-9))
    line += f" | bf16 experts rel |err| worst layer moekit {worst[0]:.4f} eager {worst[1]:.4f}"
    for mine, eager in layer:
        assert mine <= 1.5 * eager + 2e-3, f"bf16 experts: rel error moekit {mine:.4g}, eager {eager:.4g}"

    if model_type in NO_BF16_GENERATE:
        print(line + " | gen bf16 not run (slow reference linear attention)")
        return

    # bf16 greedy generate: identical until eager's top-2 margin is within bf16 noise, the smaller
    # of the two implementations' max logit error (to f32) on the prompt, doubled
    tok_e, log_e = greedy(model, ids, "eager")
    tok_m, _ = greedy(model, ids, "moekit")
    noise = 2 * min(float((e16 - ref).abs().max()), float((m16 - ref).abs().max()))
    top2 = log_e.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]                                  # [n, B]
    near_tie = first_true(margin < noise, GEN_TOKENS)                     # [B]
    agree = first_true((tok_m != tok_e).t(), GEN_TOKENS)                  # [B]
    print(line + f" | gen bf16 identical {agree.tolist()}, first near-tie {near_tie.tolist()} "
          f"(margin < {noise:.3f})")
    assert bool((agree >= near_tie).all()), (
        f"bf16 greedy: identical for {agree.tolist()} tokens, but eager's first near-tie (top-2 margin < "
        f"{noise:.3g}) is at {near_tie.tolist()}")


def test_from_pretrained(tmp_path, moekit_calls):
    model = tiny_model("mixtral")
    ids = prompt(2)
    ref = logits(model, ids, "eager")
    mine = logits(model, ids, "moekit")
    model.save_pretrained(tmp_path)
    moekit_calls.clear()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="moekit").eval()
    assert loaded.config._experts_implementation == "moekit"
    with torch.no_grad():
        got = loaded(ids).logits.float()
    assert moekit_calls, "from_pretrained(experts_implementation='moekit') never reached moekit"
    torch.testing.assert_close(got, mine, rtol=0, atol=1e-6 * float(mine.abs().max()))
    assert rel_max(got, ref) <= F32_REL


# ------------------------------------------------------------------ 2. what moekit refuses
def _run_model(model_type: str, **over):
    model = tiny_model(model_type, **over)
    model.set_experts_implementation("moekit")
    with torch.no_grad():
        model(prompt(3))


def test_refused_gpt_oss():
    if not _known("gpt_oss"):
        pytest.skip(f"transformers {transformers.__version__} has no GPT-OSS")
    # GPT-OSS experts: biases, interleaved gate / up, clamped SwiGLU (_apply_gate); the bias is named first
    with pytest.raises(NotImplementedError, match="bias"):
        _run_model("gpt_oss", num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])


def test_refused_nemotron_h_relu2():
    if not _known("nemotron_h"):
        pytest.skip(f"transformers {transformers.__version__} has no Nemotron-H")
    # up-only experts (has_gate=False, served) with a squared-ReLU activation (not served)
    with pytest.raises(NotImplementedError, match="activation: ReLUSquaredActivation"):
        _run_model("nemotron_h")


def _base_experts(config, transposed: bool = False, gated: bool = True):
    """__init__ body of the test experts classes: weights in transformers' layouts."""
    E, H, inter = config.num_experts, config.hidden_size, config.intermediate_size
    n = 2 * inter if gated else inter
    g = torch.Generator().manual_seed(config.seed)
    w1 = torch.randn(E, n, H, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, inter, generator=g) * inter ** -0.5
    if transposed:
        w1, w2 = w1.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    return nn.Parameter(w1), nn.Parameter(w2)


def experts_class(act_gate=None, **flags):
    """A transformers experts class (use_experts_implementation(**flags)) whose own forward, the
    "eager" implementation, computes each (token, slot) from the layout's definition."""

    class TinyExperts(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = config.num_experts
            gated = flags.get("has_gate", True)
            w1, self.down_proj = _base_experts(config, flags.get("is_transposed", False), gated)
            if gated:
                self.gate_up_proj = w1
            else:
                self.up_proj = w1
            if flags.get("has_bias"):
                self.gate_up_proj_bias = nn.Parameter(torch.zeros(config.num_experts, 2 * config.intermediate_size))
                self.down_proj_bias = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
            self.act_fn = ACT2FN[config.hidden_act]

        def forward(self, hidden_states, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden_states, dtype=torch.float32)
            for t in range(hidden_states.shape[0]):
                for j in range(top_k_index.shape[1]):
                    e = int(top_k_index[t, j])
                    if e >= self.num_experts:
                        continue
                    w1 = self.gate_up_proj[e] if self.has_gate else self.up_proj[e]
                    w2 = self.down_proj[e]
                    if self.is_transposed:
                        w1, w2 = w1.t(), w2.t()
                    h = w1.float() @ hidden_states[t].float()
                    if not self.has_gate:
                        a = self.act_fn(h)
                    elif self.is_concatenated:
                        gate, up = h.chunk(2)
                        a = self.act_fn(gate) * up
                    else:
                        a = self.act_fn(h[0::2]) * h[1::2]
                    out[t] += top_k_weights[t, j].float() * (w2.float() @ a)
            return out.to(hidden_states.dtype)

    if act_gate is not None:
        TinyExperts._apply_gate = act_gate
    return hf_moe.use_experts_implementation(TinyExperts, **flags)


def experts_config(E=6, H=32, inter=24, act="silu", seed=0, impl="eager"):
    return types.SimpleNamespace(num_experts=E, hidden_size=H, intermediate_size=inter, hidden_act=act, seed=seed,
                                 _experts_implementation=impl)


def experts_inputs(T=16, H=32, E=6, k=2, seed=10, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]  # int64, as torch.topk gives
    w = torch.rand(T, k, generator=g)
    return x, ids, (w / w.sum(dim=1, keepdim=True)).to(dtype)


def run_experts(module, impl: str, *inputs):
    module.config._experts_implementation = impl
    with torch.no_grad():
        return module(*inputs)


def _clamped_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return self.act_fn(gate.clamp(max=7.0)) * up.clamp(-7.0, 7.0)


@pytest.mark.parametrize("kind, match", [
    pytest.param("has_bias", "has expert biases", id="has_bias"),
    pytest.param("post_norm", "post-expert norm", id="post_norm"),
    pytest.param("apply_gate", "custom gate .*TinyExperts._apply_gate", id="apply_gate"),
    pytest.param("relu", "activation: ReLU", id="relu"),
])
def test_refused_module(kind, match):
    act = "relu" if kind == "relu" else "silu"
    if kind == "has_bias":
        cls = experts_class(has_bias=True)
    elif kind == "post_norm":
        if "has_post_expert_norm" not in inspect.signature(hf_moe.use_experts_implementation).parameters:
            pytest.skip(f"transformers {transformers.__version__} has no post-expert norms")
        cls = experts_class(has_post_expert_norm=True)
    elif kind == "apply_gate":
        cls = experts_class(act_gate=_clamped_gate)
    else:
        cls = experts_class()
    module = cls(experts_config(act=act))
    with pytest.raises(NotImplementedError, match=match):
        run_experts(module, "moekit", *experts_inputs())
    with pytest.raises(NotImplementedError, match=match):  # with gradients too: no fallback around a refusal
        module.config._experts_implementation = "moekit"
        module(*experts_inputs())


# ------------------------------------------------------------------ 3. gradients
def _mixtral_grads(impl: str):
    model = tiny_model("mixtral", num_local_experts=4)
    model.set_experts_implementation(impl)
    ids = prompt(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = model(ids, labels=ids).loss
        loss.backward()
    layers = model.model.layers
    grads = {"gate_up_proj[0]": layers[0].mlp.experts.gate_up_proj.grad,
             "down_proj[1]": layers[1].mlp.experts.down_proj.grad,
             "router[0]": layers[0].mlp.gate.weight.grad,
             "embed": model.model.embed_tokens.weight.grad}
    return loss.detach(), grads, [str(w.message) for w in caught if "moekit" in str(w.message)]


def test_gradients_fall_back_to_grouped_mm(moekit_calls):
    loss_e, grads_e, warns_e = _mixtral_grads("eager")
    loss_m, grads_m, warns_m = _mixtral_grads("moekit")
    assert not warns_e
    assert warns_m and all("gradients are needed" in w for w in warns_m), warns_m
    assert not moekit_calls, "moekit ran (it has no backward) although gradients were needed"
    torch.testing.assert_close(loss_m, loss_e, rtol=1e-6, atol=0)
    for name, g in grads_e.items():
        assert g is not None and grads_m[name] is not None, name
        torch.testing.assert_close(grads_m[name], g, rtol=1e-4, atol=1e-5 * float(g.abs().max()), msg=name)


def test_gradients_input_only(moekit_calls):
    """Frozen experts, a hidden state that needs a gradient: still transformers' path."""
    module = experts_class()(experts_config())
    module.requires_grad_(False)
    x, ids, w = experts_inputs()
    grads = {}
    for impl in ("eager", "moekit"):
        xi = x.clone().requires_grad_(True)
        module.config._experts_implementation = impl
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module(xi, ids, w).pow(2).sum().backward()
        assert any("gradients are needed" in str(c.message) for c in caught) == (impl == "moekit")
        grads[impl] = xi.grad
    assert not moekit_calls
    torch.testing.assert_close(grads["moekit"], grads["eager"], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ 4. expert-parallel sentinels
def test_expert_parallel_sentinels(moekit_calls):
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    E, H = 6, 32
    cfg = tiny_config("mixtral", hidden_size=H, intermediate_size=24, num_local_experts=E)
    module = MixtralExperts(cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        module.gate_up_proj.copy_(torch.randn(module.gate_up_proj.shape, generator=g) * H ** -0.5)
        module.down_proj.copy_(torch.randn(module.down_proj.shape, generator=g) * 24 ** -0.5)
    module._is_expert_parallel = True
    T, k = 24, 3
    x = torch.randn(T, H, generator=g)
    ids = torch.randint(0, E + 4, (T, k), generator=g)  # E.. E+3: experts of other ranks
    ids[0] = E  # a token with only sentinels
    w = torch.rand(T, k, generator=g) + 0.1  # nonzero at the sentinels too: they must still drop out
    assert bool((ids >= E).any()) and bool((ids < E).any())
    out = {impl: run_experts(module, impl, x, ids, w) for impl in ("moekit", "grouped_mm")}
    # batched_mm clamps sentinel ids into range and relies on the router having zeroed their
    # weights (RouterParallel does; transformers 5.17): compare it on such weights.
    wz = torch.where(ids >= E, torch.zeros_like(w), w)
    torch.testing.assert_close(run_experts(module, "moekit", x, ids, wz), out["moekit"], rtol=0, atol=0)
    torch.testing.assert_close(run_experts(module, "batched_mm", x, ids, wz), out["moekit"], rtol=1e-5, atol=1e-6,
                               msg="batched_mm")
    assert len(moekit_calls) == 2
    # eager takes id == E (its one_hot has E + 1 classes) as "skip" (transformers >= 5.24; older
    # eager raises on it, and grouped_mm is the reference there)
    impls = ["grouped_mm"]
    try:
        out["eager"] = run_experts(module, "eager", x, ids.clamp(max=E), w)
        impls.append("eager")
    except RuntimeError:
        pass
    assert float(out["moekit"][0].abs().max()) == 0.0
    for impl in impls:
        torch.testing.assert_close(out["moekit"], out[impl], rtol=1e-5, atol=1e-6, msg=impl)


# ------------------------------------------------------------------ 5. layouts, weight updates
LAYOUTS = {
    "plain": {},
    "transposed": dict(is_transposed=True),
    "interleaved": dict(is_concatenated=False),
    "transposed_interleaved": dict(is_transposed=True, is_concatenated=False),
    "up_only": dict(has_gate=False),
    "up_only_transposed": dict(has_gate=False, is_transposed=True),
}


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout(layout, act, moekit_calls):
    module = experts_class(**LAYOUTS[layout])(experts_config(act=act))
    inputs = experts_inputs()
    ref = run_experts(module, "eager", *inputs)
    got = run_experts(module, "moekit", *inputs)
    assert len(moekit_calls) == 1
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    if module.is_concatenated:  # transformers' own grouped_mm knows the flags but not interleaving
        torch.testing.assert_close(got, run_experts(module, "grouped_mm", *inputs), rtol=1e-5, atol=1e-5)


def _update(module, param: str, how: str):
    p = getattr(module, param)
    if how == "data_mul":
        p.data.mul_(2)  # bypasses the version counter
    elif how == "no_grad_mul":
        with torch.no_grad():
            p.mul_(2)
    elif how == "data_copy":
        p.data.copy_(p.data.flip(0))  # new values, same storage
    else:  # a new tensor
        p.data = p.data * 2


@pytest.mark.parametrize("how", ["data_mul", "no_grad_mul", "data_copy", "data_assign"])
@pytest.mark.parametrize("layout", ["plain", "transposed", "interleaved", "up_only_transposed"])
def test_weight_update_after_call(layout, how):
    flags = LAYOUTS[layout]
    module = experts_class(**flags)(experts_config())
    inputs = experts_inputs()
    before = run_experts(module, "moekit", *inputs)
    torch.testing.assert_close(before, run_experts(module, "eager", *inputs), rtol=1e-5, atol=1e-5)
    for param in ("gate_up_proj" if flags.get("has_gate", True) else "up_proj", "down_proj"):
        _update(module, param, how)
        got = run_experts(module, "moekit", *inputs)
        ref = run_experts(module, "eager", *inputs)
        assert not torch.allclose(ref, before)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=f"after updating {param} ({how})")
        before = got


def test_weight_update_real_model():
    """Aria's experts are stored transposed (moekit re-lays them out): a model whose weights change
    in place through .data after a moekit call (a weight loader, a PEFT merge) still matches eager."""
    if not _known("aria_text"):
        pytest.skip(f"transformers {transformers.__version__} has no Aria")
    model = tiny_model("aria_text")
    experts = experts_modules(model)
    if not experts:
        pytest.skip(f"transformers {transformers.__version__}: Aria's experts do not go through the interface")
    assert all(m.is_transposed for m in experts)
    ids = prompt(5)
    before = logits(model, ids, "moekit")
    for m in experts:
        m.gate_up_proj.data.mul_(1.5)
        m.down_proj.data.copy_(m.down_proj.data.flip(0))
    ref = logits(model, ids, "eager")
    got = logits(model, ids, "moekit")
    assert rel_max(before, ref) > 1e-2
    assert rel_max(got, ref) <= F32_REL


# ------------------------------------------------------------------ 6. fp8
FP8_BLOCK = (128, 128)


def _fp8_module(H=256, inter=128, E=4, block=FP8_BLOCK, seed=7, fill=True, **kw):
    """transformers' FP8Experts as replace_with_fp8_linear builds it, filled like a checkpoint:
    weights ~ N(0, 1/fan_in) quantized per block (scale_inv = amax / 448)."""
    from transformers import MixtralConfig
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts
    cfg = MixtralConfig(hidden_size=H, intermediate_size=inter, num_local_experts=E, num_experts_per_tok=2)
    cls = hf_moe.use_experts_implementation(experts_class=FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS)
    module = cls(cfg, block_size=block, **kw)
    if not fill:
        return module
    g = torch.Generator().manual_seed(seed)
    bn, bk = block
    for name, fan_in in (("gate_up_proj", H), ("down_proj", inter)):
        w = getattr(module, name)
        s = getattr(module, name + "_scale_inv")
        real = torch.randn(w.shape, generator=g) * fan_in ** -0.5
        q, scale = torch.empty(w.shape), torch.ones(s.shape)
        for i in range(-(-w.shape[1] // bn)):
            for j in range(-(-w.shape[2] // bk)):
                blk = real[:, i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
                scale[:, i, j] = blk.abs().amax(dim=(1, 2)) / 448.0
                q[:, i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = blk / scale[:, i, j, None, None]
        with torch.no_grad():
            w.copy_(q.to(torch.float8_e4m3fn))
            s.copy_(scale * (1 + 0.25 * torch.rand(scale.shape, generator=g)))  # any f32 scale, not just amax
    return module


def _act_quant(x: torch.Tensor, bk: int) -> torch.Tensor:
    """transformers' (DeepSeek-V3's) dynamic activation quantization, per 1 x bk group, dequantized."""
    groups = x.float().unflatten(-1, (-1, bk))
    s = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 448.0
    return ((groups / s).to(torch.float8_e4m3fn).float() * s).flatten(-2)


def _fp8_reference(module, x, ids, w, quantize_activations: bool):
    try:
        from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no _dequantize_fp8_weight (the reference)")
    block = list(module.block_size)
    w1 = _dequantize_fp8_weight(module.gate_up_proj.detach(), module.gate_up_proj_scale_inv.detach(), block,
                                torch.float32)
    w2 = _dequantize_fp8_weight(module.down_proj.detach(), module.down_proj_scale_inv.detach(), block,
                                torch.float32)
    q = (lambda t: _act_quant(t, block[1])) if quantize_activations else (lambda t: t.float())
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gate, up = (w1[ids[t, j]] @ q(x[t])).chunk(2)
            out[t] += float(w[t, j]) * (w2[ids[t, j]] @ q(module.act_fn(gate) * up))
    return out


def _rel(a, b):
    return float((a.float() - b).norm() / b.norm())


def test_fp8_block_experts(moekit_calls):
    try:
        module = _fp8_module()
    except Exception as e:  # noqa: BLE001 -- any failure to build it on the CPU is a skip, said why
        pytest.skip(f"transformers' FP8Experts cannot be constructed on the CPU here: {type(e).__name__}: {e}")
    assert module.gate_up_proj.dtype == torch.float8_e4m3fn
    assert list(module.gate_up_proj_scale_inv.shape) == [4, 2, 2]
    x, ids, w = experts_inputs(T=24, H=256, E=4, k=2, seed=8, dtype=torch.bfloat16)
    w = w.float()
    got = run_experts(module, "moekit", x, ids, w)
    assert len(moekit_calls) == 1 and moekit_calls[0] == torch.float8_e4m3fn
    assert got.dtype == torch.bfloat16
    emulated = _fp8_reference(module, x, ids, w, quantize_activations=True)
    exact = _fp8_reference(module, x, ids, w, quantize_activations=False)
    r_emu, r_exact = _rel(got, emulated), _rel(got, exact)
    print(f"\n[hf-parity] fp8 block {FP8_BLOCK}: rel error vs quantized-activation reference {r_emu:.4f}, "
          f"vs dequantized weights with exact activations {r_exact:.4f} (that reference's own "
          f"quantization error {_rel(emulated, exact):.4f})")
    assert r_emu < 2e-2, r_emu
    assert r_exact < 6e-2, r_exact


ONLINE_FP8 = {"moekit_fp8_tensor": "fp8_per_tensor", "moekit_fp8_channel": "fp8_per_row",
              "moekit_fp8_block": "fp8_block"}


@pytest.mark.parametrize("layout", ["plain", "transposed", "interleaved", "up_only"])
@pytest.mark.parametrize("impl", list(ONLINE_FP8))
def test_online_fp8_schemes(impl, layout, moekit_calls):
    """moekit_fp8_*: a bf16 module's experts quantized at the first call, kept, and run W8A8:
    close to eager bf16 (fp8 rounding), no re-quantization on later calls, a fresh copy after a
    weight change the version counter sees, and after clear_cache() for one it does not."""
    assert mhf.SCHEMES[impl] == ONLINE_FP8[impl]
    flags = LAYOUTS[layout]
    module = experts_class(**flags)(experts_config(E=4, H=256, inter=128)).to(torch.bfloat16)
    x, ids, w = experts_inputs(T=24, H=256, E=4, k=2, seed=3, dtype=torch.bfloat16)
    ref = run_experts(module, "eager", x, ids, w).float()
    got = run_experts(module, impl, x, ids, w)
    assert moekit_calls == [torch.float8_e4m3fn] and got.dtype == torch.bfloat16
    err = _rel(got, ref)
    print(f"\n[hf-parity] {impl} {layout}: rel error vs eager bf16 {err:.4f}")
    assert err < 0.08, err
    kept = module._moekit_fp8
    torch.testing.assert_close(run_experts(module, impl, x, ids, w), got, rtol=0, atol=0)
    assert module._moekit_fp8 is kept  # no second quantization
    param = "gate_up_proj" if flags.get("has_gate", True) else "up_proj"
    with torch.no_grad():
        getattr(module, param).mul_(2)  # bumps the version counter: a fresh copy
    assert _rel(run_experts(module, impl, x, ids, w), run_experts(module, "eager", x, ids, w).float()) < 0.08
    assert module._moekit_fp8 is not kept
    getattr(module, param).data.mul_(0.5)  # .data: invisible to the key until clear_cache()
    stale = run_experts(module, impl, x, ids, w)
    assert _rel(stale, ref) > 0.2
    holder = nn.ModuleList([module])
    assert mhf.clear_cache(holder) == 1 and module._moekit_fp8 is None
    assert _rel(run_experts(module, impl, x, ids, w), ref) < 0.08


def test_online_fp8_model(moekit_calls):
    """experts_implementation="moekit_fp8_block" on a whole model: every layer's experts through
    moekit's fp8 path; per layer, on the same inputs (router flips cannot enter), within fp8
    rounding of eager bf16."""
    model = tiny_model("mixtral", hidden_size=128, intermediate_size=128).to(torch.bfloat16)
    ids = prompt(4)
    logits(model, ids, "moekit_fp8_block")
    assert set(moekit_calls) == {torch.float8_e4m3fn} and len(moekit_calls) == model.config.num_hidden_layers
    model.set_experts_implementation("eager")
    errs = []
    for module, args, kw in capture_experts_inputs(model, ids):
        with torch.no_grad():
            ref = module(*args, **kw).float()
            module.config._experts_implementation = "moekit_fp8_block"
            got = module(*args, **kw).float()
            module.config._experts_implementation = "eager"
        errs.append(_rel(got, ref))
    print(f"\n[hf-parity] mixtral moekit_fp8_block per-layer rel error vs eager bf16: "
          f"{', '.join(f'{e:.4f}' for e in errs)}")
    assert len(errs) == model.config.num_hidden_layers and max(errs) < 0.08, errs


@pytest.mark.parametrize("kind, match", [
    pytest.param("static", "activation_scheme='static'", id="static"),
    pytest.param("small_2i", r"2I < block size", id="small_2i"),
    pytest.param("fp4", "fp8 e4m3fn only; no fp4", id="fp4"),
])
def test_fp8_refused(kind, match):
    try:
        if kind == "static":
            module = _fp8_module(activation_scheme="static")
        elif kind == "small_2i":  # 2I = 128 = bn: transformers keeps one scale row per half
            module = _fp8_module(inter=64)
        else:
            module = _fp8_module(expert_dtype="fp4", fill=False)  # int8-packed e2m1 weights
            assert module.gate_up_proj.dtype == torch.int8
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"transformers' FP8Experts cannot be constructed on the CPU here: {type(e).__name__}: {e}")
    x, ids, w = experts_inputs(T=4, H=256, E=4, k=2, seed=9, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=match):
        run_experts(module, "moekit", x, ids, w.float())


# ------------------------------------------------------------------ 7. Llama-4 (module swap)
def test_llama4_swap():
    if not _known("llama4_text"):
        pytest.skip(f"transformers {transformers.__version__} has no Llama-4")
    from transformers import Llama4ForCausalLM, Llama4TextConfig
    cfg = Llama4TextConfig(hidden_size=64, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                           num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                           max_position_embeddings=256, pad_token_id=0, initializer_range=0.1)
    torch.manual_seed(0)
    model = Llama4ForCausalLM(cfg).eval()
    ids = prompt(6)
    with torch.no_grad():
        ref = model(ids).logits
    tok_ref, _ = greedy(model, ids, "eager")
    block = model.model.layers[0].feed_forward
    h = torch.randn(5, cfg.hidden_size)
    with torch.no_grad():
        _, block_logits = block(h)
    assert mhf.swap_moe_blocks(model) == 2
    from moekit.layer import MoELayer
    routes = []
    real_route = MoELayer.route
    swapped = model.model.layers[0].feed_forward
    swapped.layer.route = lambda x: routes.append(1) or real_route(swapped.layer, x)
    with torch.no_grad():
        out, got_logits = swapped(h)
    assert len(routes) == 1  # routed once per forward
    torch.testing.assert_close(got_logits, block_logits)
    assert not any(type(m).__name__ == "Llama4TextMoe" for m in model.modules())
    with torch.no_grad():
        got = model(ids).logits
    tok, _ = greedy(model, ids, "eager")
    f32 = rel_max(got, ref)
    print(f"\n[hf-parity] llama4_text swap_moe_blocks: f32 max rel {f32:.2e}, generate "
          f"{int((tok == tok_ref).all(dim=0).long().cumprod(0).sum())}/{GEN_TOKENS} identical")
    assert f32 <= F32_REL
    assert torch.equal(tok, tok_ref)


# ------------------------------------------------------------------ 8. torch.compile
def test_compile():
    """torch.compile (inductor, fullgraph=False) of a 1-layer Mixtral running "moekit": the graph
    holds moekit's op (not a fallback) and the logits are eager's."""
    from torch._inductor.compile_fx import compile_fx
    model = tiny_model("mixtral", num_hidden_layers=1, num_local_experts=4)
    ids = prompt(7)
    ref = logits(model, ids, "eager")
    model.set_experts_implementation("moekit")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, fullgraph=False)
        with torch.no_grad():
            got = compiled(ids).logits.float()
    finally:
        torch._dynamo.reset()
    assert any("moekit" in g for g in graphs), "no compiled graph holds a moekit op"
    assert rel_max(got, ref) <= F32_REL
