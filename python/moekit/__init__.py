"""moekit: fused Mixture-of-Experts operators for PyTorch (torch.ops.moekit) and vLLM 0.33's API.

    import moekit
    w, ids, _ = moekit.fused_topk(x, router_logits, topk=2, renormalize=True)
    y = moekit.fused_experts(x, w1, w2, w, ids)

Functions: moekit.api (fused_topk, grouped_topk, fused_experts with vLLM 0.33's signatures;
sigmoid_topk, prepack, unprepack, shuffle_weight, unshuffle_weight, quantize_fp8,
convert_fp8_fnuz_to_fn, sort_tokens); the raw ops:
torch.ops.moekit.* (schemas in csrc/torch/schemas.cpp); the MoE layer: moekit.MoELayer
(moekit.layer); transformers' experts implementation "moekit" (moekit.hf, registered here when
transformers is installed: from_pretrained(..., experts_implementation="moekit")).
MOEKIT_USE_FUSED_MOE=0 (read once, at import) routes every function to its pure-torch twin in
moekit.reference. docs/python.md has the details.
"""

import torch as _torch

from . import _ops
from .api import *  # noqa: F401,F403
from .api import USE_FUSED_MOE, __all__ as _api_all

try:  # the installed distribution's version (VERSION at build time: the one source)
    from importlib.metadata import PackageNotFoundError as _NotFound, version as _version
    __version__ = _version("moekit")
except _NotFound:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
__all__ = list(_api_all) + ["MoELayer", "ops"]

#: The raw ops (torch.ops.moekit), present when the extension is loaded.
ops = _torch.ops.moekit if _ops.loaded else None

from . import hf  # noqa: E402  (after the ops: hf's forwards call them)

hf.register_if_installed()


def __getattr__(name):
    # The layer module is imported on first use, so the functions above never depend on it.
    if name == "MoELayer":
        from .layer import MoELayer

        return MoELayer
    raise AttributeError(f"module 'moekit' has no attribute {name!r}")
