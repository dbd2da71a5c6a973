"""Loads the torch.ops.moekit extension and registers the fake (meta) implementations.

The schemas and the CPU / CUDA implementations live in C++ (csrc/torch/schemas.cpp, ops.cpp,
ops_cuda.cpp); loading ``_moekit_ops.so`` registers them. Every op writes caller-allocated outputs
(``Tensor(a!)`` in its schema) and returns nothing, so a fake implementation has nothing to compute:
it exists so that FakeTensor tracing, ``torch.compile(fullgraph=True)`` and
``torch.library.opcheck`` can run through the ops. Tests: tests/python/test_ops.py.
"""

from __future__ import annotations

import os

import torch

#: Every op of the ``moekit`` torch library, in schemas.cpp order.
OP_NAMES = (
    "topk_softmax",
    "grouped_topk",
    "sigmoid_topk",
    "sort_tokens",
    "quantize_fp8",
    "quantize_fp8_static",
    "convert_fp8",
    "shuffle_weight",
    "unshuffle_weight",
    "pack_weight",
    "unpack_weight",
    "fused_moe",
    "ck_moe",
    "asm_moe",
    "asm_moe_tkw1",
    "fmoe_fp8_blockscale_g1u1",
)

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_moekit_ops.so")

#: Why the extension could not be loaded (None once it is loaded).
load_error: str | None = None


def _load() -> bool:
    global load_error
    if hasattr(torch.ops, "moekit") and hasattr(torch.ops.moekit, "fused_moe"):
        return True  # already loaded (e.g. by a test that loaded a build-tree copy first)
    if not os.path.exists(_LIBRARY):
        load_error = f"{_LIBRARY} does not exist (install the package with `pip install .`)"
        return False
    try:
        torch.ops.load_library(_LIBRARY)
    except OSError as e:  # e.g. built against a different torch
        load_error = f"cannot load {_LIBRARY}: {e}"
        return False
    return True


def _register_fakes() -> None:
    # Each op mutates its outputs in place and returns (), so the fake is the same no-op for all.
    def _fake(*args, **kwargs) -> None:
        return None

    for name in OP_NAMES:
        torch.library.register_fake(f"moekit::{name}")(_fake)


loaded = _load()
if loaded:
    _register_fakes()
