"""MoekitExperts: moekit's fused_moe as an experts class of vLLM's modular fused-MoE kernel.

vLLM's modular kernel splits a MoE layer into prepare (dispatch, input quantization), experts
(both GEMMs and the activation) and finalize (top-k weight and reduce, combine). This class is
the experts part: it takes the unquantized activations (``expects_unquantized_inputs``: moekit
quantizes per its own scheme, per token / per 1x128 group), runs ``moekit.fused_experts`` with the
layer's ``FusedMoEQuantConfig`` and writes the weighted top-k sum itself (finalize does nothing,
``TopKWeightAndReduceNoOP``). Supported: bf16 / f16 activations; silu, gelu, gelu_tanh (gated);
weights unquantized, fp8 per-tensor or per-channel with dynamic activations, fp8 128x128 blocks;
expert maps (EP without all-to-all kernels); router weight on the input (k = 1). Devices: CPU,
and CUDA sm_90 where moekit was built with its CUDA backend. Everything else reports the reason
from is_supported_config and vLLM keeps its own kernel.

Imported only where vLLM is installed (moekit.vllm_plugin imports it on demand). Tests:
tests/python/test_vllm.py; docs: docs/vllm.md.
"""

from __future__ import annotations

import logging

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8Dynamic128Sym,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8Static128BlockSym,
    kFp8StaticChannelSym,
    kFp8StaticTensorSym,
)
from vllm.platforms import current_platform

from . import api

_log = logging.getLogger("vllm.moekit")

# (weight key, activation key) pairs moekit runs. Static activation scales are left to vLLM:
# moekit quantizes the intermediate per token, so it would not honour a checkpoint's a2 scale.
_QUANT_SCHEMES = (
    (None, None),
    (kFp8StaticTensorSym, kFp8DynamicTensorSym),  # online fp8 (quantization="fp8")
    (kFp8StaticTensorSym, kFp8DynamicTokenSym),
    (kFp8StaticChannelSym, kFp8DynamicTokenSym),  # per-channel W8A8
    (kFp8Static128BlockSym, kFp8Dynamic128Sym),  # DeepSeek-V3 128x128 blocks
)
_ACTIVATIONS = (MoEActivation.SILU, MoEActivation.GELU, MoEActivation.GELU_TANH)
_DTYPES = (torch.bfloat16, torch.float16)


def _has_cuda_kernels() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("moekit::fused_moe", "CUDA")


class MoekitExperts(mk.FusedMoEExpertsModular):
    """moekit.fused_experts behind vLLM's FusedMoEExpertsModular interface (Standard format)."""

    def __init__(self, moe_config, quant_config, max_num_tokens=None, num_dispatchers=None):
        super().__init__(moe_config, quant_config, max_num_tokens, num_dispatchers)
        self._logged_kernels: set = set()
        # Token counts whose kernel was looked up: the choice is a function of the token count for
        # this layer's fixed shapes, so each count is asked about once, not on every forward.
        self._asked_tokens: set = set()

    @staticmethod
    def activation_format() -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    @property
    def expects_unquantized_inputs(self) -> bool:
        return True  # moekit quantizes the activations itself, per its scheme

    @staticmethod
    def is_supported_config(cls, moe_config, weight_key, activation_key, activation_format):
        ok, reason = mk.FusedMoEExperts.is_supported_config(cls, moe_config, weight_key, activation_key,
                                                            activation_format)
        if not ok:
            return ok, reason
        if moe_config.in_dtype not in _DTYPES:
            return False, f"kernel does not support activations of {moe_config.in_dtype} (moekit: bf16, f16)"
        if moe_config.has_bias:
            return False, "kernel does not support expert biases"
        if moe_config.swiglu_limit is not None or moe_config.swiglu_alpha is not None:
            return False, "kernel does not support a clamped / scaled SwiGLU"
        return True, None

    @staticmethod
    def _supports_current_device() -> bool:
        if current_platform.is_cpu():
            return True
        return (current_platform.is_cuda() and current_platform.is_device_capability_family(90)
                and _has_cuda_kernels())

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        return False

    @staticmethod
    def _supports_quant_scheme(weight_key, activation_key) -> bool:
        return (weight_key, activation_key) in _QUANT_SCHEMES

    @staticmethod
    def _supports_activation(activation) -> bool:
        return activation in _ACTIVATIONS

    @staticmethod
    def _supports_parallel_config(moe_parallel_config) -> bool:
        # Tokens arrive in the Standard format with the no-DP/EP prepare-finalize; an EP shard's
        # expert_map is moekit's expert_map. All-to-all kernels bring other formats.
        return not moe_parallel_config.use_all2all_kernels

    def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                         activation):
        return (0,), (0,), (M, K)  # moekit sizes and owns its workspace

    def finalize_weight_and_reduce_impl(self) -> mk.TopKWeightAndReduce:
        return TopKWeightAndReduceNoOP()  # apply() writes the weighted top-k sum

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        if apply_router_weight_on_input:
            # prepare() already scaled the input by the weight (k = 1): the output is not weighted again.
            topk_weights = torch.ones_like(topk_weights)
        kwargs = dict(activation=activation.value, global_num_experts=global_num_experts, expert_map=expert_map,
                      quant_config=self.quant_config if self.quant_config.is_quantized else None)
        if hidden_states.shape[0] not in self._asked_tokens and not torch.compiler.is_compiling():
            self._asked_tokens.add(hidden_states.shape[0])
            self._log_kernel(output, hidden_states, w1, w2, topk_weights, topk_ids, kwargs)
        api.fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, out=output, **kwargs)

    def _log_kernel(self, output, hidden_states, w1, w2, topk_weights, topk_ids, kwargs) -> None:
        """Logs each moekit kernel this layer runs, once (decode and prefill may differ)."""
        name = api.fused_experts_kernel(hidden_states, w1, w2, topk_weights, topk_ids, out=output, **kwargs)
        if name not in self._logged_kernels:
            self._logged_kernels.add(name)
            _log.info("moekit: vLLM MoE layer runs moekit kernel %s (T=%d, E=%d, scheme %s)", name,
                      hidden_states.shape[0], w1.shape[0], _scheme_name(self.quant_config))


def _scheme_name(quant_config) -> str:
    if not quant_config.is_quantized:
        return "unquantized"
    if quant_config.block_shape is not None:
        return f"fp8 blocks {list(quant_config.block_shape)}"
    return "fp8 per-channel" if quant_config.per_out_ch_quant else "fp8 per-tensor"
