"""Hostile input on the Python API (issue 28): every bad argument raises an exception that names it
and the offending dtype / value / device, before any output is written; nothing is silently
converted into a different answer. Covers the id / map conversion of fused_experts and
sort_tokens, tensors on the meta device mixed with real ones, the exception each StatusCode
becomes, and argument checks done before an allocation sized by the argument.
The C++ checks behind the ops: test_ops.py (test_errors_name_the_argument_...). Run: pytest tests/python.
"""

from __future__ import annotations

import pytest
import torch

import moekit
from conftest import moe_problem, randn, requires_cuda, requires_ops

pytestmark = requires_ops

I64 = torch.int64
OOM_ERROR = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def poisoned_out(x: torch.Tensor) -> torch.Tensor:
    """An `out` filled with a byte pattern, to check that a failed call writes nothing."""
    return torch.empty_like(x).view(torch.uint8).fill_(0xAB).view(x.dtype)


def assert_untouched(out: torch.Tensor) -> None:
    assert bool((out.view(torch.uint8) == 0xAB).all()), "out was written by a call that failed"


# ------------------------------------------------------------------------------- meta device
def test_meta_weight_with_cpu_input_raises():
    """The Meta key outranks CPU, so such a call used to run the no-op fake and return `out`
    unwritten (uninitialised memory)."""
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=r"^moekit.fused_moe: w1 is on device meta, expected cpu like hidden_states$"):
        moekit.fused_experts(x, w1.to("meta"), w2, w, ids, out=out)
    with pytest.raises(ValueError, match=r"^moekit.fused_moe: w2 is on device meta, expected cpu like hidden_states$"):
        torch.ops.moekit.fused_moe(out, x, w1, w2.to("meta"), w, ids)
    with pytest.raises(ValueError, match=r"^moekit.fused_moe: hidden_states is on device meta, expected cpu like w1$"):
        moekit.fused_experts(x.to("meta"), w1, w2, w, ids)
    with pytest.raises(ValueError, match=r"^moekit.fused_moe: out is on device meta, expected cpu like hidden_states$"):
        torch.ops.moekit.fused_moe(out.to("meta"), x, w1, w2, w, ids)
    assert_untouched(out)


def test_meta_tensor_in_routing_and_sorting_ops_raises():
    g = randn((4, 8), 1)
    wts, ids, tei = torch.empty(4, 2), torch.empty(4, 2, dtype=torch.int32), torch.empty(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^moekit.topk_softmax: gating_output is on device meta, expected cpu like "
                                         r"topk_weights$"):
        torch.ops.moekit.topk_softmax(wts, ids, tei, g.to("meta"), True)
    with pytest.raises(ValueError, match=r"^moekit.sigmoid_topk: topk_ids is on device meta, expected cpu like "
                                         r"gating_output$"):
        torch.ops.moekit.sigmoid_topk(wts, ids.to("meta"), g)
    _, _, _, w, ids = moe_problem(4, 64, 32, 4, 2, seed=5)
    with pytest.raises(ValueError, match=r"^moekit.sort_tokens: topk_weights is on device meta, expected cpu like "
                                         r"topk_ids$"):
        moekit.sort_tokens(ids, w.to("meta"), 4, 4)


def test_all_meta_calls_still_infer_shapes():
    x, w1, w2, w, ids = (t.to("meta") for t in moe_problem(4, 64, 32, 4, 2, seed=1))
    y = moekit.fused_experts(x, w1, w2, w, ids.to(I64))  # int64 on meta: no values to read
    assert y.device.type == "meta" and y.shape == (4, 64)
    wts, tids = moekit.fused_topk(x, randn((4, 8), 1).to("meta"), 2, True)
    assert wts.device.type == "meta" and tids.shape == (4, 2)


# ---------------------------------------------------------------- StatusCode -> Python exception
# Values of moekit::StatusCode (include/moekit/core/status.h).
@pytest.mark.parametrize("code, exc, message", [
    (1, ValueError, r"^moekit.raise_status: need 12 GiB$"),
    (2, NotImplementedError, r"^moekit.raise_status: need 12 GiB$"),
    (3, RuntimeError, r"^moekit.raise_status: backend_error: need 12 GiB$"),
    (4, RuntimeError, r"^moekit.raise_status: internal: need 12 GiB$"),
    (5, OOM_ERROR, r"^moekit.raise_status: out of memory: need 12 GiB$"),
])
def test_status_codes_become_python_exceptions(code, exc, message):
    with pytest.raises(exc, match=message) as info:
        torch.ops.moekit_testing.raise_status(code, "need 12 GiB")
    if code == 5:
        assert isinstance(info.value, RuntimeError)  # torch.OutOfMemoryError is one: old handlers still catch it


def test_raise_status_refuses_ok():
    with pytest.raises(ValueError, match="code must be a failing StatusCode value, got 0"):
        torch.ops.moekit_testing.raise_status(0, "")
