"""moekit inside vLLM: the ``vllm.general_plugins`` entry point and the ``MOEKIT_VLLM_MOE`` switch.

vLLM calls :func:`register` in every process it starts (pyproject.toml names it). With
``MOEKIT_VLLM_MOE=1`` it wraps vLLM's two MoE kernel oracles, ``select_unquantized_moe_backend``
(bf16 / f16 layers) and ``select_fp8_moe_backend`` (fp8 per-tensor, per-channel W8A8, 128x128
blocks), so that they pick :class:`moekit.vllm_experts.MoekitExperts` wherever it supports the
layer, and vLLM's own choice everywhere else (with the reason, logged once). Without the variable
(the default) register() changes nothing. No model code changes either way.

The experts class plugs into vLLM's modular kernel under the oracle's usual backend name for
weights that need no re-layout (TRITON), so vLLM loads, converts and quantizes the weights exactly
as for its Triton kernel; only the expert computation is moekit's. Tested with vLLM
``TESTED_VLLM`` (tests/python/test_vllm.py, scripts/test_vllm.sh); another version logs a warning.
docs/vllm.md has the details.
"""

from __future__ import annotations

import logging
import os
import sys

#: The vLLM versions the plugin was tested with, [low, high) (pyproject.toml's `vllm` extra says the same).
TESTED_VLLM = ((0, 33, 0), (0, 34, 0))
#: The switch: 1 routes vLLM's MoE layers through moekit; unset or 0 leaves vLLM as it is.
ENV = "MOEKIT_VLLM_MOE"

_log = logging.getLogger("vllm.moekit")  # under vllm's logger: printed with vLLM's own format


def enabled() -> bool:
    """MOEKIT_VLLM_MOE as a bool (unset = off); ValueError for a value that is not a boolean."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    raise ValueError(f"{ENV}: must be 0 or 1 (or true/false, on/off, yes/no), got {os.environ[ENV]!r}")


def _version_tested(version: str) -> bool:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return TESTED_VLLM[0] <= tuple(parts) < TESTED_VLLM[1]


def register() -> None:
    """vLLM's plugin hook: with MOEKIT_VLLM_MOE=1, make vLLM's MoE oracles pick moekit."""
    if not enabled():
        return
    import vllm
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_oracle
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as unquantized_oracle

    if not _version_tested(vllm.__version__):
        low, high = (".".join(map(str, v)) for v in TESTED_VLLM)
        _log.warning("moekit: %s=1 with vLLM %s; the plugin was tested with vllm>=%s,<%s", ENV, vllm.__version__,
                     low, high)
    _patch(unquantized_oracle, "select_unquantized_moe_backend", _select_unquantized)
    _patch(fp8_oracle, "select_fp8_moe_backend", _select_fp8)
    _log.info("moekit: %s=1: vLLM's unquantized and fp8 MoE layers run moekit's fused_moe where it "
              "supports them", ENV)


def _patch(module, name: str, make_wrapper) -> None:
    """Replaces module.name by make_wrapper(original), also in every loaded module that imported it
    by name (`from ...oracle.fp8 import select_fp8_moe_backend`). Idempotent: vLLM may call
    register() more than once per process."""
    current = getattr(module, name)
    if getattr(current, "_moekit_original", None) is not None:
        return
    wrapper = make_wrapper(current)
    wrapper._moekit_original = current
    for mod in list(sys.modules.values()):
        if mod is not None and getattr(mod, name, None) is current:
            setattr(mod, name, wrapper)


def _activation_format(moe_config):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    batched = moe_config.moe_parallel_config.use_batched_activation_format
    return mk.FusedMoEActivationFormat.BatchedExperts if batched else mk.FusedMoEActivationFormat.Standard


def _pick(kind: str, moe_config, weight_key, activation_key):
    """(True, experts class) when moekit supports the layer, else (False, reason)."""
    from .vllm_experts import MoekitExperts

    ok, reason = MoekitExperts.is_supported_config(MoekitExperts, moe_config, weight_key, activation_key,
                                                   _activation_format(moe_config))
    if ok:
        _log_once(f"moekit: {kind} MoE layers use MoekitExperts ({ENV}=1; quant scheme "
                  f"{weight_key} x {activation_key})")
        return True, MoekitExperts
    _log_once(f"moekit: {ENV}=1 but moekit does not run this {kind} MoE layer: {reason}; vLLM's own "
              "choice stays", warning=True)
    return False, reason


def _select_unquantized(original):
    def select_unquantized_moe_backend(moe_config, *args, **kwargs):
        from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

        ok, experts = _pick("unquantized", moe_config, None, None)
        if ok:
            return UnquantizedMoeBackend.TRITON, experts
        return original(moe_config, *args, **kwargs)

    return select_unquantized_moe_backend


def _select_fp8(original):
    def select_fp8_moe_backend(config, weight_key, activation_key, *args, **kwargs):
        from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend

        ok, experts = _pick("fp8", config, weight_key, activation_key)
        if ok:
            return Fp8MoeBackend.TRITON, experts
        return original(config, weight_key, activation_key, *args, **kwargs)

    return select_fp8_moe_backend


_logged: set = set()


def _log_once(message: str, warning: bool = False) -> None:
    if message in _logged:
        return
    _logged.add(message)
    (_log.warning if warning else _log.info)(message)
