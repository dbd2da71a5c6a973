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
from conftest import assert_close_lowp, moe_problem, randn, requires_cuda, requires_ops

pytestmark = requires_ops

I64 = torch.int64
OOM_ERROR = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def poisoned_out(x: torch.Tensor) -> torch.Tensor:
    """An `out` filled with a byte pattern, to check that a failed call writes nothing."""
    return torch.empty_like(x).view(torch.uint8).fill_(0xAB).view(x.dtype)


def assert_untouched(out: torch.Tensor) -> None:
    assert bool((out.view(torch.uint8) == 0xAB).all()), "out was written by a call that failed"


# ------------------------------------------------------------------ ids and maps: dtype and range
# Each wraps into a valid int32 id when cast (2**32 + j -> j, -2**32 - 1 -> -1 = no expert), or out
# of int32 (2**31): all must be rejected with the value as given.
@pytest.mark.parametrize("value", [2**32, 2**32 + 3, -2**32 - 1, 2**31, 4, -2])
def test_fused_experts_int64_ids_out_of_range_rejected_before_converting(value):
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    bad = ids.to(I64)
    bad[2, 1] = value
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=rf"topk_ids\[2, 1\]: expert id must be in \[-1, 4\), got {value}$"):
        moekit.fused_experts(x, w1, w2, w, bad, out=out)
    assert_untouched(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bool, torch.complex64,
                                   torch.uint32])
def test_fused_experts_ids_of_other_dtypes_rejected(dtype):
    """Float ids used to be truncated, bool and complex ids cast; uint32 has no range checks in torch."""
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=rf"topk_ids: dtype must be int32 or int64 .*got {dtype}$"):
        moekit.fused_experts(x, w1, w2, w, (ids.float() + 0.7).to(dtype), out=out)
    assert_untouched(out)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.int8, torch.uint8])
def test_fused_experts_other_integer_ids_match_int32(dtype):
    x, w1, w2, w, ids = moe_problem(6, 64, 32, 4, 2, seed=2)
    ids[1, 0] = -1
    if dtype == torch.uint8:
        ids[1, 0] = 3  # no -1 in uint8
    want = moekit.fused_experts(x, w1, w2, w, ids)
    assert torch.equal(moekit.fused_experts(x, w1, w2, w, ids.to(dtype)), want)


def test_fused_experts_weights_must_be_floating():
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    out = poisoned_out(x)
    for bad in (w.to(torch.int32), w.to(torch.complex64), w.bool()):
        with pytest.raises(ValueError, match=rf"topk_weights: dtype must be a floating point type .*got {bad.dtype}"):
            moekit.fused_experts(x, w1, w2, bad, ids, out=out)
    # ids and weights swapped (a classic slip): refused, not run with float ids truncated
    with pytest.raises(ValueError, match="topk_ids: dtype"):
        moekit.fused_experts(x, w1, w2, ids, w, out=out)
    assert_untouched(out)
    assert torch.equal(moekit.fused_experts(x, w1, w2, w.double(), ids), moekit.fused_experts(x, w1, w2, w, ids))


def test_fused_experts_expert_map_checked_like_ids():
    x, _, _, w, ids = moe_problem(6, 64, 32, 8, 2, seed=21)
    _, w1, w2, _, _ = moe_problem(1, 64, 32, 4, 1, seed=22)
    emap = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32)
    want = moekit.fused_experts(x, w1, w2, w, ids, expert_map=emap)
    assert torch.equal(moekit.fused_experts(x, w1, w2, w, ids.to(I64), expert_map=emap.to(I64)), want)
    out = poisoned_out(x)
    bad = emap.to(I64)
    bad[6] = 2**32 + 3  # would wrap to local expert 3
    with pytest.raises(ValueError, match=r"expert_map\[6\]: local expert \(or -1\) must be in \[-1, 4\), got 4294967299"):
        moekit.fused_experts(x, w1, w2, w, ids, expert_map=bad, out=out)
    with pytest.raises(ValueError, match=r"expert_map: dtype must be int32 or int64 .*got torch.float32"):
        moekit.fused_experts(x, w1, w2, w, ids, expert_map=emap.float(), out=out)
    with pytest.raises(ValueError, match=r"expert_map: must be 1-D \[Eg\], got shape \[\]"):
        moekit.fused_experts(x, w1, w2, w, ids, expert_map=torch.tensor(1, dtype=torch.int32), out=out)
    # the ids' range is the map's length Eg = 8, not E = 4
    bad_ids = ids.to(I64)
    bad_ids[0, 0] = 8
    with pytest.raises(ValueError, match=r"topk_ids\[0, 0\]: expert id must be in \[-1, 8\), got 8"):
        moekit.fused_experts(x, w1, w2, w, bad_ids, expert_map=emap, out=out)
    assert_untouched(out)


def test_fused_experts_w1_of_the_wrong_rank_is_a_value_error():
    x, w1, w2, w, ids = moe_problem(4, 64, 32, 4, 2, seed=1)
    for bad in (torch.tensor(1.0, dtype=x.dtype), w1[0]):  # used to be an IndexError for 0-D
        with pytest.raises(ValueError, match=r"w1: must be 3-D"):
            moekit.fused_experts(x, bad, w2, w, ids)


def test_sort_tokens_converts_int64_and_checks_values():
    _, _, _, w, ids = moe_problem(8, 64, 32, 4, 2, seed=5)
    want = moekit.sort_tokens(ids, w, 4, 4)
    for got, ref in zip(moekit.sort_tokens(ids.to(I64), w.double(), 4, 4), want):
        assert torch.equal(got, ref)
    bad = ids.to(I64)
    bad[5, 0] = 2**32 + 1
    with pytest.raises(ValueError, match=r"topk_ids\[5, 0\]: expert id must be in \[-1, 4\), got 4294967297"):
        moekit.sort_tokens(bad, w, 4, 4)
    with pytest.raises(ValueError, match=r"topk_ids: dtype must be int32 or int64 .*got torch.float32"):
        moekit.sort_tokens(ids.float(), w, 4, 4)
    emap = torch.tensor([0, -1, 1, -1, 2, 3], dtype=I64)
    emap_bad = emap.clone()
    emap_bad[3] = -2**32 + 2  # would wrap to 2
    with pytest.raises(ValueError, match=r"expert_map\[3\]: local expert \(or -1\) must be in \[-1, 4\), "
                                         r"got -4294967294"):
        moekit.sort_tokens(ids, w, 4, 4, expert_map=emap_bad)
    mask = torch.tensor([1, 0, 1, 1, 0, 1], dtype=I64)
    mask[4] = 2**32  # would wrap to 0
    with pytest.raises(ValueError, match=r"expert_mask\[4\]: mask value must be in \[0, 2\), got 4294967296"):
        moekit.sort_tokens(ids, w, 4, 4, expert_mask=mask)


def test_sort_tokens_huge_sizes_rejected_before_allocating():
    _, _, _, w, ids = moe_problem(4, 64, 32, 4, 2, seed=5)
    for E, block_m in ((2**40, 4), (4, 2**40), (2**31, 2)):
        with pytest.raises(ValueError, match=r"max_padded = T\*k \+ E\*block_m - k must be <= 2\^31 - 1"):
            moekit.sort_tokens(ids, w, E, block_m)
    with pytest.raises(ValueError, match=r"num_experts: must be >= 1, got -1"):
        moekit.sort_tokens(ids, w, -1, 4)


# --------------------------------------------------------------------------------------- routing
@pytest.mark.parametrize("topk", [-1, 0, 9, 2**40, 2**62])
def test_routing_topk_checked_before_allocating(topk):
    """A negative or huge topk used to fail in torch.empty (negative dimension, out of memory)."""
    x, g = randn((4, 16), 0), randn((4, 8), 1)
    with pytest.raises(ValueError, match=rf"topk: must be in \[1, E=8\], got {topk}$"):
        moekit.fused_topk(x, g, topk, True)
    with pytest.raises(ValueError, match=rf"topk: must be in \[1, E=8\], got {topk}$"):
        moekit.sigmoid_topk(g, topk)
    with pytest.raises(ValueError, match=rf"topk: must be in \[1, E=8\], got {topk}$"):
        moekit.grouped_topk(x, g, topk, True, 2, 1)
    with pytest.raises(ValueError, match=r"topk: must be an integer, got 2.5"):
        moekit.fused_topk(x, g, 2.5, True)


def test_grouped_topk_complex_bias_rejected():
    x, g = randn((4, 16), 0), randn((4, 8), 1)
    with pytest.raises(ValueError, match=r"e_score_correction_bias: dtype must be real, got torch.complex64"):
        moekit.grouped_topk(x, g, 2, True, 2, 1, "sigmoid", 1.0, torch.zeros(8, dtype=torch.complex64))


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
    wts, tids, tei = moekit.fused_topk(x, randn((4, 8), 1).to("meta"), 2, True)
    assert wts.device.type == "meta" and tids.shape == (4, 2) and tei.shape == (4, 2)


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


# ------------------------------------------------------------------------- tracing and capture
def test_compile_fullgraph_with_int64_ids():
    """int64 ids under torch.compile(fullgraph=True): no graph break from the value check (skipped
    while tracing), same answer as eager; an out-of-range id still fails, in the op, instead of
    wrapping into a valid one."""
    x, w1, w2, w, ids = moe_problem(8, 64, 32, 4, 2, seed=3)

    def layer(x, ids):
        return moekit.fused_experts(x, w1, w2, w, ids)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(x, ids.to(I64)), layer(x, ids))
    bad = ids.to(I64)
    bad[3, 0] = 2**32 + 1
    with pytest.raises(ValueError, match=r"topk_ids\[3, 0\]: expert id must be in \[-1, Eg=4\), got -2147483648"):
        compiled(x, bad)


@requires_cuda
def test_cuda_int64_ids_checked_eagerly_and_capturable():
    """On CUDA, int64 ids cost one sync for the range check outside capture; under CUDA-graph
    capture the check is skipped (out-of-range values become INT32_MIN, skipped by the kernels)
    and replay matches eager. int32 ids are never read on the host."""
    T, H, I, E, k = 16, 256, 128, 8, 2
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed=10, device="cuda")
    bad = ids.to(I64)
    bad[1, 1] = 2**32 + 2
    out = poisoned_out(x)
    with pytest.raises(ValueError, match=r"topk_ids\[1, 1\]: expert id must be in \[-1, 8\), got 4294967298"):
        moekit.fused_experts(x, w1, w2, w, bad, out=out)
    torch.cuda.synchronize()
    assert_untouched(out)
    ids64 = ids.to(I64)
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moekit.fused_experts(x, w1, w2, w, ids64, out=out)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moekit.fused_experts(x, w1, w2, w, ids64, out=out)
    ids64.copy_(torch.roll(ids64, 1, dims=0))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_lowp(out, moekit.fused_experts(x, w1, w2, w, ids64.to(torch.int32)))
