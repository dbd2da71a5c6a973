"""Loads the torch.ops.moekit extension and registers the fake (meta) implementations.

The schemas and the CPU / CUDA implementations live in C++ (csrc/torch/schemas.cpp, ops.cpp,
ops_cuda.cpp); loading ``_moekit_ops.so`` registers them. Every op writes caller-allocated outputs
(``Tensor(a!)`` in its schema) and returns nothing, so a fake implementation has nothing to compute:
it exists so that FakeTensor tracing, ``torch.compile(fullgraph=True)`` and
``torch.library.opcheck`` can run through the ops. It also runs for real calls that mix meta and
CPU / CUDA tensors (the Meta key wins the dispatch), so it checks that all tensors share a device.
Tests: tests/python/test_ops.py.
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


def torch_mismatch(built: str, running: str) -> str | None:
    """The message when the extension was built against torch `built` and this is `running`, else
    None. torch promises no C++ ABI across versions (local tags such as +cu130 included), so they
    must be equal; MOEKIT_SKIP_TORCH_CHECK=1 loads anyway."""
    if built == running or os.environ.get("MOEKIT_SKIP_TORCH_CHECK") == "1":
        return None
    return (f"moekit was built against torch {built}, but this is torch {running}: the extension is not "
            "loaded (its C++ ABI is torch's). Rebuild it in this environment: pip install --force-reinstall "
            "--no-deps . (from moekit's source); MOEKIT_SKIP_TORCH_CHECK=1 loads it anyway")


def _load() -> bool:
    global load_error
    if hasattr(torch.ops, "moekit") and hasattr(torch.ops.moekit, "fused_moe"):
        return True  # already loaded (e.g. by a test that loaded a build-tree copy first)
    if not os.path.exists(_LIBRARY):
        load_error = f"{_LIBRARY} does not exist (install the package with `pip install .`)"
        return False
    try:
        from ._build_info import TORCH_VERSION as built
    except ImportError:  # a build tree without the installed record
        built = torch.__version__
    load_error = torch_mismatch(built, torch.__version__)
    if load_error is not None:
        import warnings
        warnings.warn(load_error, stacklevel=3)
        return False
    try:
        torch.ops.load_library(_LIBRARY)
    except OSError as e:  # e.g. built against a different torch
        load_error = f"cannot load {_LIBRARY}: {e}"
        return False
    return True


def _check_devices(op: str, arg_names, outputs, args, kwargs) -> None:
    """ValueError unless every tensor argument is on one device. Needed here because the Meta key
    outranks CPU / CUDA: a call that mixes meta with real tensors dispatches to the fake, not to
    the C++ checks, and would otherwise return its outputs unwritten. The reference device is
    the first input's that is not meta (else the first such output's); all-meta calls pass."""
    named = [(n, v) for n, v in list(zip(arg_names, args)) + list(kwargs.items()) if isinstance(v, torch.Tensor)]
    real = [(n, v) for n, v in named if v.device.type != "meta"]
    if not real:
        return
    ref_name, ref = next(((n, v) for n, v in real if n not in outputs), real[0])
    # Inputs first: with a meta x and real weights, "hidden_states is on device meta" says more
    # than naming the output allocated like it.
    for name, t in sorted(named, key=lambda nv: nv[0] in outputs):
        if t.device != ref.device:
            raise ValueError(f"moekit.{op}: {name} is on device {t.device}, expected {ref.device} like {ref_name}")


def _make_fake(name: str):
    schema = getattr(torch.ops.moekit, name).default._schema
    arg_names = [a.name for a in schema.arguments]
    outputs = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}

    # Each op mutates its outputs in place and returns (): the fake only checks devices.
    def _fake(*args, **kwargs) -> None:
        _check_devices(name, arg_names, outputs, args, kwargs)
        return None

    return _fake


def _register_fakes() -> None:
    for name in OP_NAMES:
        torch.library.register_fake(f"moekit::{name}")(_make_fake(name))


loaded = _load()
if loaded:
    _register_fakes()
