"""moekit inside vLLM (the pinned 0.33 PyPI wheel, on the CPU): the plugin's entry point and switch,
MoekitExperts inside vLLM's modular kernel against vLLM's own torch reference, routing against
vLLM's grouped_topk and its CPU router's softmax top-k.

- The entry point: vLLM's own loader (vllm.plugins.load_general_plugins) in a fresh interpreter,
  with and without MOEKIT_VLLM_MOE=1; with it, vLLM's oracles pick MoekitExperts for bf16 and the
  three fp8 schemes, without it they are untouched.
- The experts: FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular, MoekitExperts), vLLM's no-EP
  path, against FusedMoEKernel(BatchedPrepareAndFinalize, NaiveBatchedExperts), the torch
  reference vLLM ships (dequantize, matmul, activation, weight and reduce), for bf16, fp8
  per-tensor, per-channel W8A8 and 128x128 blocks, expert maps and the router weight on the input.
- The wheel has no compiled ops for this machine (vllm._C): the ops the reference path calls get
  pure-torch versions here, only where missing: the gated activations (torch.ops._C.silu_and_mul,
  gelu_and_mul, gelu_tanh_and_mul) and the dynamic fp8 activation quantizers (per tensor, per
  token: scale = amax / 448; per 1 x 128 group, vLLM's Triton kernel, the same formula). The weight
  dequantization, the GEMMs, the per-expert batching and the weight-and-reduce stay vLLM's. Its
  CUDA-graph probe is told nothing is capturing (torch.accelerator would look for a GPU). vLLM's
  fused_topk calls a compiled op too (topk_softmax), so it cannot run here: moekit.fused_topk is
  compared with the torch softmax top-k vLLM routes with on the CPU (router/cpu_router.py) and
  checked against fused_topk's documented contract in test_api_vllm.py.

Runs where vLLM imports: scripts/test_vllm.sh makes that environment (vLLM pins its own torch and
transformers); elsewhere every test here skips with the reason. CPU only (vLLM is not installed on
the GPU machine).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vllm is imported: its CPU platform
vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/test_vllm.sh installs it)")

import moekit  # noqa: E402
import vllm.model_executor.layers.fused_moe.experts.fused_batched_moe as fbm  # noqa: E402
import vllm.model_executor.layers.fused_moe.modular_kernel as mk  # noqa: E402
import vllm.model_executor.layers.fused_moe.utils as moe_utils  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.layers.fused_moe.config import (  # noqa: E402
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    RoutingMethodType,
    fp8_w8a8_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.prepare_finalize.batched import BatchedPrepareAndFinalize  # noqa: E402
from vllm.model_executor.layers.fused_moe.prepare_finalize.no_dp_ep import (  # noqa: E402
    MoEPrepareAndFinalizeNoDPEPModular,
)
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import (  # noqa: E402
    grouped_topk as vllm_grouped_topk,
)

from moekit import vllm_plugin  # noqa: E402
from moekit.vllm_experts import MoekitExperts  # noqa: E402

FP8 = torch.float8_e4m3fn
_lib = torch.library.Library("_C", "FRAGMENT")


def _gated(act):
    def impl(out, x):
        d = x.shape[-1] // 2
        out.copy_((act(x[..., :d].float()) * x[..., d:].float()).to(out.dtype))

    return impl


for _name, _act in (("silu_and_mul", torch.nn.functional.silu), ("gelu_and_mul", torch.nn.functional.gelu),
                    ("gelu_tanh_and_mul", lambda v: torch.nn.functional.gelu(v, approximate="tanh"))):
    if not hasattr(torch.ops._C, _name):
        _lib.define(f"{_name}(Tensor(a!) out, Tensor input) -> ()")
        _lib.impl(_name, _gated(_act), "CompositeExplicitAutograd")


def _scaled(x, scale):
    return (x.float() / scale).clamp(-448.0, 448.0).to(FP8)


def _dynamic_scaled_fp8_quant(out, x, scale):
    scale.copy_((x.float().abs().amax().clamp(min=1e-12) / 448.0).reshape(scale.shape))
    out.copy_(_scaled(x, scale))


def _dynamic_per_token_scaled_fp8_quant(out, x, scale, scale_ub):
    s = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
    scale.copy_(s.reshape(scale.shape))
    out.copy_(_scaled(x, s))


def _per_token_group_quant_fp8(x, group_size, *args, column_major_scales=False, **kwargs):
    assert not column_major_scales
    g = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    s = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
    return (g / s).clamp(-448.0, 448.0).to(FP8).reshape(x.shape), s.squeeze(-1)


for _name, _schema, _fn in (
        ("dynamic_scaled_fp8_quant", "(Tensor(a!) out, Tensor input, Tensor(b!) scale) -> ()",
         _dynamic_scaled_fp8_quant),
        ("dynamic_per_token_scaled_fp8_quant",
         "(Tensor(a!) out, Tensor input, Tensor(b!) scale, Tensor? scale_ub) -> ()",
         _dynamic_per_token_scaled_fp8_quant)):
    if not hasattr(torch.ops._C, _name):
        _lib.define(_name + _schema)
        _lib.impl(_name, _fn, "CompositeExplicitAutograd")


@pytest.fixture(autouse=True)
def _cpu_stand_ins(monkeypatch):
    monkeypatch.setattr(fbm, "_is_capturing_or_compiling", lambda: False)
    monkeypatch.setattr(moe_utils, "per_token_group_quant_fp8", _per_token_group_quant_fp8)


def moe_config(E, k, H, I, activation=MoEActivation.SILU, dtype=torch.bfloat16):
    return FusedMoEConfig(num_experts=E, experts_per_token=k, hidden_dim=H, intermediate_size=I,
                          num_local_experts=E, num_logical_experts=E, activation=activation, device="cpu",
                          routing_method=RoutingMethodType.Renormalize,
                          moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=dtype)


def quantize(w, scheme):
    """fp8 weights and vLLM's scale layout for a scheme: per-tensor [E], per-channel [E, N, 1],
    blocks [E, N/128, K/128]."""
    E, N, K = w.shape
    if scheme == "fp8_tensor":
        s = w.float().abs().amax(dim=(1, 2)).clamp(min=1e-12) / 448.0
        return (w.float() / s[:, None, None]).to(FP8), s
    if scheme == "fp8_channel":
        s = w.float().abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 448.0
        return (w.float() / s).to(FP8), s
    b = w.float().reshape(E, N // 128, 128, K // 128, 128)
    s = b.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448.0
    return (b / s[:, :, None, :, None]).reshape(E, N, K).to(FP8), s


def quant_config(scheme, s1, s2):
    if scheme == "bf16":
        return FusedMoEQuantConfig.make()
    return fp8_w8a8_moe_quant_config(w1_scale=s1, w2_scale=s2, per_act_token_quant=scheme == "fp8_channel",
                                     per_out_ch_quant=scheme == "fp8_channel",
                                     block_shape=[128, 128] if scheme == "fp8_block" else None)


def run_both(cfg, qc, x, w1, w2, weights, ids, *, expert_map=None, on_input=False, rank=0):
    """(moekit, vLLM's reference) outputs of one layer; rank: the EP shard the reference's batched
    prepare/finalize keeps (experts [rank * E_local, (rank + 1) * E_local))."""
    moekit_kernel = mk.FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular(), MoekitExperts(cfg, qc))
    T, E = x.shape[0], w1.shape[0]
    reference = mk.FusedMoEKernel(BatchedPrepareAndFinalize(max_num_tokens=T, num_local_experts=E, num_dispatchers=1,
                                                            rank=rank),
                                  fbm.NaiveBatchedExperts(cfg, qc, max_num_tokens=T, num_dispatchers=1))
    outs = []
    for kernel in (moekit_kernel, reference):
        outs.append(kernel.apply(x.clone(), w1, w2, topk_weights=weights, topk_ids=ids, activation=cfg.activation,
                                 global_num_experts=cfg.num_experts, expert_map=expert_map,
                                 apply_router_weight_on_input=on_input))
    return outs


def routing(T, E, k, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    w, ids = torch.topk(logits.softmax(-1), k)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def problem(T, E, k, H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w1 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(torch.bfloat16)
    return x, w1, w2


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


# Largest difference / largest output. fp8: moekit quantizes the intermediate to fp8 (as vLLM's
# Triton kernel does), the reference keeps it in bf16; for per-tensor weights moekit also scales the
# activations per token where the reference takes one scale per tensor. Measured (T = 1, 7, 64):
# bf16 0.003-0.009, per-channel 0.018-0.030, blocks 0.021-0.027, per-tensor 0.022-0.071.
TOLERANCE = {"bf16": 0.02, "fp8_channel": 0.05, "fp8_tensor": 0.1, "fp8_block": 0.05}


@pytest.mark.parametrize("scheme", ["bf16", "fp8_tensor", "fp8_channel", "fp8_block"])
@pytest.mark.parametrize("T", [1, 7, 64])
def test_experts_match_vllm_reference(scheme, T):
    E, k, H, I = 8, 2, 256, 128
    x, w1, w2 = problem(T, E, k, H, I, seed=T)
    weights, ids = routing(T, E, k, seed=T)
    s1 = s2 = None
    if scheme != "bf16":
        (w1, s1), (w2, s2) = quantize(w1, scheme), quantize(w2, scheme)
    ours, ref = run_both(moe_config(E, k, H, I), quant_config(scheme, s1, s2), x, w1, w2, weights, ids)
    assert ours.shape == ref.shape == (T, H) and ours.dtype == ref.dtype == torch.bfloat16
    assert rel_err(ours, ref) < TOLERANCE[scheme]


@pytest.mark.parametrize("activation", [MoEActivation.GELU, MoEActivation.GELU_TANH])
def test_experts_activations(activation):
    E, k, H, I = 4, 2, 128, 64
    x, w1, w2 = problem(9, E, k, H, I, seed=3)
    weights, ids = routing(9, E, k, seed=3)
    cfg = moe_config(E, k, H, I, activation=activation)
    ours, ref = run_both(cfg, FusedMoEQuantConfig.make(), x, w1, w2, weights, ids)
    assert rel_err(ours, ref) < TOLERANCE["bf16"]


def test_experts_router_weight_on_input():
    """Llama-4 (k = 1): prepare() scales the input by the weight; neither side weights again."""
    E, H, I = 4, 128, 64
    x, w1, w2 = problem(11, E, 1, H, I, seed=5)
    weights, ids = routing(11, E, 1, seed=5)
    weights = torch.sigmoid(torch.randn(11, 1))
    ours, ref = run_both(moe_config(E, 1, H, I), FusedMoEQuantConfig.make(), x, w1, w2, weights, ids, on_input=True)
    assert rel_err(ours, ref) < TOLERANCE["bf16"]


def test_experts_expert_map():
    """An EP shard: experts 4..7 of 8 are local (expert_map); ids of the other shard contribute
    nothing. vLLM's reference keeps the same shard by rank."""
    Eg, E, k, H, I = 8, 4, 2, 128, 64
    x, w1, w2 = problem(16, E, k, H, I, seed=7)
    weights, ids = routing(16, Eg, k, seed=7)
    expert_map = torch.full((Eg,), -1, dtype=torch.int32)
    expert_map[4:] = torch.arange(E, dtype=torch.int32)
    ours, ref = run_both(moe_config(Eg, k, H, I), FusedMoEQuantConfig.make(), x, w1, w2, weights, ids,
                         expert_map=expert_map, rank=1)
    assert rel_err(ours, ref) < TOLERANCE["bf16"]


def test_supported_configs_and_reasons():
    ok, reason = MoekitExperts.is_supported_config(MoekitExperts, moe_config(8, 2, 256, 128), None, None,
                                                   mk.FusedMoEActivationFormat.Standard)
    assert ok, reason
    ok, reason = MoekitExperts.is_supported_config(MoekitExperts, moe_config(8, 2, 256, 128, dtype=torch.float32),
                                                   None, None, mk.FusedMoEActivationFormat.Standard)
    assert not ok and "float32" in reason
    ok, reason = MoekitExperts.is_supported_config(MoekitExperts, moe_config(8, 2, 256, 128), None, None,
                                                   mk.FusedMoEActivationFormat.BatchedExperts)
    assert not ok and "activation format" in reason
    cfg = moe_config(8, 2, 256, 128, activation=MoEActivation.SWIGLUOAI)
    ok, reason = MoekitExperts.is_supported_config(MoekitExperts, cfg, None, None, mk.FusedMoEActivationFormat.Standard)
    assert not ok and "activation" in reason


def test_env_values():
    for value, want in (("", False), ("0", False), ("1", True), ("true", True), ("off", False)):
        os.environ[vllm_plugin.ENV] = value
        try:
            assert vllm_plugin.enabled() is want
        finally:
            del os.environ[vllm_plugin.ENV]
    os.environ[vllm_plugin.ENV] = "2"
    try:
        with pytest.raises(ValueError, match="MOEKIT_VLLM_MOE.*'2'"):
            vllm_plugin.enabled()
    finally:
        del os.environ[vllm_plugin.ENV]


PLUGIN_SCRIPT = textwrap.dedent("""
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    import vllm.model_executor.layers.quantization.fp8 as q_fp8   # binds select_fp8_moe_backend by name
    import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as q_bf16
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu
    cfg = FusedMoEConfig(num_experts=8, experts_per_token=2, hidden_dim=256, intermediate_size=128,
                         num_local_experts=8, num_logical_experts=8, activation=MoEActivation.SILU, device="cpu",
                         routing_method=RoutingMethodType.Renormalize,
                         moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=torch.bfloat16)
    print("PICK bf16", q_bf16.select_unquantized_moe_backend(cfg)[1].__name__)
    for name, keys in (("fp8_tensor", (qu.kFp8StaticTensorSym, qu.kFp8DynamicTensorSym)),
                       ("fp8_channel", (qu.kFp8StaticChannelSym, qu.kFp8DynamicTokenSym)),
                       ("fp8_block", (qu.kFp8Static128BlockSym, qu.kFp8Dynamic128Sym))):
        try:
            pick = q_fp8.select_fp8_moe_backend(cfg, *keys)[1]
            print("PICK", name, getattr(pick, "__name__", pick))
        except Exception as e:
            print("PICK", name, "raised", type(e).__name__)
""")


def run_plugin_script(env_value):
    env = dict(os.environ)
    env.pop(vllm_plugin.ENV, None)
    if env_value is not None:
        env[vllm_plugin.ENV] = env_value
    r = subprocess.run([sys.executable, "-c", PLUGIN_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_plugin_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "moekit"]
    assert [ep.value for ep in eps] == ["moekit.vllm_plugin:register"]


def test_plugin_switch_on_routes_every_scheme_to_moekit():
    out = run_plugin_script("1")
    for scheme in ("bf16", "fp8_tensor", "fp8_channel", "fp8_block"):
        assert f"PICK {scheme} MoekitExperts" in out, out
    assert "vllm.moekit moekit: MOEKIT_VLLM_MOE=1" in out, out
    assert "MoE layers use MoekitExperts" in out, out


def test_plugin_switch_off_changes_nothing():
    out = run_plugin_script(None)
    assert "MoekitExperts" not in out and "moekit" not in out.replace("PICK", ""), out
    assert "PICK bf16" in out, out


METHOD_SCRIPT = textwrap.dedent("""
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from moekit.reference import ref_fused_experts
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    E, k, H, I = 8, 2, 128, 64
    cfg = FusedMoEConfig(num_experts=E, experts_per_token=k, hidden_dim=H, intermediate_size=I, num_local_experts=E,
                         num_logical_experts=E, activation=MoEActivation.SILU, device="cpu",
                         routing_method=RoutingMethodType.Renormalize,
                         moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=torch.bfloat16)
    with set_current_vllm_config(VllmConfig()):
        method = UnquantizedFusedMoEMethod(cfg)       # vLLM's method for unquantized MoE layers
        print("EXPERTS", method.experts_cls.__name__)
        if method.experts_cls.__name__ != "MoekitExperts":
            sys.exit(0)
        layer = torch.nn.Module()                     # the attributes vLLM's layer gives the method
        method.create_weights(layer, E, H, I, torch.bfloat16)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            layer.w13_weight.copy_(torch.randn(E, 2 * I, H, generator=g) * H ** -0.5)
            layer.w2_weight.copy_(torch.randn(E, H, I, generator=g) * I ** -0.5)
        layer.moe_config, layer._expert_routing_tables = cfg, lambda: None
        layer.activation, layer.apply_router_weight_on_input = MoEActivation.SILU, False
        layer.global_num_experts, layer.expert_map = E, None
        method.process_weights_after_loading(layer)
        x = torch.randn(5, H, generator=g).to(torch.bfloat16)
        w, ids = torch.topk(torch.randn(5, E, generator=g).softmax(-1), k)
        y = method.apply(layer, x, w, ids.to(torch.int32), None, None)
        want = ref_fused_experts(x, layer.w13_weight, layer.w2_weight, w, ids.to(torch.int32))
        print("MAXERR", ((y.float() - want.float()).abs().max() / want.float().abs().max()).item())
""")


def test_plugin_routes_vllms_unquantized_moe_method():
    """vLLM's UnquantizedFusedMoEMethod (what its FusedMoE layer runs) with the switch: its oracle
    picks MoekitExperts, vLLM's weight processing and modular kernel run, and the output is
    moekit's reference; the kernel is logged. Without the switch vLLM's own CPU experts stay."""
    env = dict(os.environ, **{vllm_plugin.ENV: "1"})
    r = subprocess.run([sys.executable, "-c", METHOD_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "EXPERTS MoekitExperts" in r.stdout, r.stdout
    assert "Using MoekitExperts MoE backend" in r.stdout + r.stderr
    assert "vLLM MoE layer runs moekit kernel fused_moe" in r.stdout, r.stdout
    err = float(r.stdout.split("MAXERR")[1].split()[0])
    assert err < 0.02, r.stdout
    env.pop(vllm_plugin.ENV)
    r = subprocess.run([sys.executable, "-c", METHOD_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "EXPERTS" in r.stdout and "Moekit" not in r.stdout, r.stdout


def test_kernel_is_logged_once(caplog):
    E, k, H, I = 4, 2, 128, 64
    x, w1, w2 = problem(5, E, k, H, I)
    weights, ids = routing(5, E, k, seed=1)
    kernel = mk.FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular(), MoekitExperts(moe_config(E, k, H, I),
                                                                                   FusedMoEQuantConfig.make()))
    with caplog.at_level("INFO", logger="vllm.moekit"):
        for _ in range(3):
            kernel.apply(x, w1, w2, topk_weights=weights, topk_ids=ids, activation=MoEActivation.SILU,
                         global_num_experts=E, expert_map=None, apply_router_weight_on_input=False)
    lines = [r.getMessage() for r in caplog.records if "runs moekit kernel" in r.getMessage()]
    assert len(lines) == 1, lines
    name = moekit.fused_experts_kernel(x, w1, w2, weights, ids)
    assert f"kernel {name} " in lines[0] and "unquantized" in lines[0]


@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_topk_matches_vllm(scoring_func, with_bias):
    T, E, k, groups, topk_group = 33, 64, 6, 8, 3
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(T, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1 if with_bias else None
    x = torch.zeros(T, 16)
    want_w, want_ids = vllm_grouped_topk(x, logits, k, True, num_expert_group=groups, topk_group=topk_group,
                                         scoring_func=scoring_func, routed_scaling_factor=2.5,
                                         e_score_correction_bias=bias)
    w, ids = moekit.grouped_topk(x, logits, k, True, num_expert_group=groups, topk_group=topk_group,
                                 scoring_func=scoring_func, routed_scaling_factor=2.5, e_score_correction_bias=bias)
    order_ours, order_want = ids.long().sort(-1), want_ids.long().sort(-1)
    assert torch.equal(order_ours.values, order_want.values)
    torch.testing.assert_close(w.gather(1, order_ours.indices), want_w.float().gather(1, order_want.indices),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (37, 64, 6), (5, 128, 8)])
def test_fused_topk_matches_vllm_cpu_router(renormalize, T, E, k):
    """vLLM's fused_topk needs its compiled topk_softmax; on the CPU vLLM routes softmax top-k in
    torch (router/cpu_router.py, _softmax_topk): moekit.fused_topk against that."""
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _softmax_topk

    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(T * E + k))
    want_w, want_ids = _softmax_topk(logits, k, renormalize)
    w, ids, token_expert_indices = moekit.fused_topk(logits, logits, k, renormalize)
    order_ours, order_want = ids.long().sort(-1), want_ids.long().sort(-1)
    assert torch.equal(order_ours.values, order_want.values)
    torch.testing.assert_close(w.gather(1, order_ours.indices), want_w.gather(1, order_want.indices),
                               rtol=1e-5, atol=1e-6)
    assert ids.dtype == want_ids.dtype == torch.int32 and token_expert_indices.shape == (T, k)
