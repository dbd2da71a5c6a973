"""torch integration of torch.ops.moekit: torch.library.opcheck on every op (schema / mutation
annotations, fake implementations, AOT dispatch), torch.compile(fullgraph=True) through the public
functions, CUDA-graph capture and replay with changed inputs (GPU), and the environment switches
(MOEKIT_USE_FUSED_MOE, MOEKIT_BACKEND / MOEKIT_PRINT_DISPATCH) in subprocesses.
Parity with the reference: test_ops.py. Run: pytest tests/python.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import moekit
from moekit import _ops
from conftest import assert_close_lowp, assert_similar, moe_problem, randn, requires_cuda, requires_ops

FP8 = torch.float8_e4m3fn
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def op_cases(device: str):
    """(op name, args) with small valid arguments for every op of the library."""
    T, H, I, E, k = 6, 64, 32, 4, 2
    x, w1, w2, w, ids = moe_problem(T, H, I, E, k, seed=1, device=device)
    g = randn((T, 16), seed=2, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    q1 = w1.to(FP8)
    q2 = w2.to(FP8)
    s1, s2 = torch.rand(E, 2 * I, 1, **f32) * 0.01, torch.rand(E, H, 1, **f32) * 0.01
    # The block case: H = I = 128, the smallest shape the CUDA block kernels take (multiples of 128).
    xb, w1b, w2b, _, _ = moe_problem(T, 128, 128, E, k, seed=6, device=device)
    b1, b2 = torch.rand(E, 2, 1, **f32) * 0.01, torch.rand(E, 1, 1, **f32) * 0.01
    w_one = w[:, :1].contiguous()
    ids_one = ids[:, :1].contiguous()
    padded = moekit.sort_tokens_max_padded(T, k, E, 4)
    bf = torch.bfloat16
    return [
        ("topk_softmax", (torch.empty(T, 2, **f32), torch.empty(T, 2, **i32), torch.empty(T, 2, **i32), g, True)),
        ("grouped_topk", (torch.empty(T, 4, **f32), torch.empty(T, 4, **i32), g, randn((16,), 3, device=device),
                          4, 2, "sigmoid", True, 2.5)),
        ("sigmoid_topk", (torch.empty(T, 1, **f32), torch.empty(T, 1, **i32), g)),
        ("sort_tokens", (torch.empty(padded, **i32), torch.empty(padded, **f32),
                         torch.empty(moekit.sort_tokens_max_blocks(T, k, E, 4), **i32), torch.empty(1, **i32),
                         ids, w, E, 4, "packed")),
        ("quantize_fp8", (torch.empty(T, H, dtype=FP8, device=device), torch.empty(T, 1, **f32), x, "per_row")),
        ("quantize_fp8_static", (torch.empty(T, H, dtype=FP8, device=device), x, torch.tensor([0.05], **f32))),
        ("convert_fp8", (torch.empty(T, H, dtype=FP8, device=device), torch.empty(T, 1, **f32),
                         x.to(torch.float8_e4m3fnuz), torch.ones(T, 1, **f32))),
        ("shuffle_weight", (torch.empty_like(w1), w1)),
        ("unshuffle_weight", (torch.empty_like(w1), w1)),
        ("pack_weight", (torch.empty_like(w1), w1)),
        ("unpack_weight", (torch.empty_like(w1), w1)),
        ("fused_moe", (torch.empty_like(x), x, w1, w2, w, ids)),
        ("ck_moe", (torch.empty_like(x), x, w1, w2, w, ids)),
        ("asm_moe", (torch.empty_like(x), x, q1, q2, w, ids, s1, s2)),
        ("asm_moe_tkw1", (torch.empty_like(x), x, q1, q2, w_one, ids_one, s1, s2)),
        ("fmoe_fp8_blockscale_g1u1", (torch.empty(T, 128, dtype=bf, device=device), xb, w1b.to(FP8), w2b.to(FP8),
                                      w, ids, b1, b2)),
    ]


def test_every_op_has_a_case():
    assert sorted(name for name, _ in op_cases("cpu")) == sorted(_ops.OP_NAMES)


@requires_ops
@pytest.mark.parametrize("name", _ops.OP_NAMES)
def test_opcheck(name):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this torch has no torch.library.opcheck")
    args = dict(op_cases("cpu"))[name]
    op = getattr(torch.ops.moekit, name).default
    has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES for a in args)
    # NOTE: opcheck's test_schema compares tensors with float kernels that torch lacks for fp8
    # ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); ops with fp8 tensors get the
    # same mutation check done on raw bytes instead.
    utils = tuple(u for u in OPCHECK_UTILS if not (has_fp8 and u == "test_schema"))
    torch.library.opcheck(op, args, test_utils=utils)
    if has_fp8:
        check_mutations_bitwise(op, args)


# Ops without a CUDA kernel (moekit ops --json lists the kernels per backend).
NO_CUDA_KERNEL = ("shuffle_weight", "unshuffle_weight", "pack_weight", "unpack_weight")


@requires_cuda
@pytest.mark.parametrize("name", [n for n in _ops.OP_NAMES if n not in NO_CUDA_KERNEL])
def test_opcheck_cuda(name):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("this torch has no torch.library.opcheck")
    args = dict(op_cases("cuda"))[name]
    op = getattr(torch.ops.moekit, name).default
    has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES for a in args)
    utils = tuple(u for u in OPCHECK_UTILS if not (has_fp8 and u == "test_schema"))
    torch.library.opcheck(op, args, test_utils=utils)


def check_mutations_bitwise(op, args) -> None:
    """Every tensor argument not marked Tensor(a!) in the schema keeps every byte."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    op(*args)
    for arg, old, schema_arg in zip(args, before, op._schema.arguments):
        if old is None:
            continue
        written = schema_arg.alias_info is not None and schema_arg.alias_info.is_write
        same = torch.equal(arg.view(torch.uint8), old.view(torch.uint8))
        assert written or same, f"{op}: {schema_arg.name} changed but is not marked Tensor(a!)"


@requires_ops
@pytest.mark.parametrize("scheme", ["bf16", "fp8_row", "fp8_block"])
def test_compile_fullgraph_through_fused_experts(scheme):
    """Routing + fused_experts under torch.compile(fullgraph=True) (no graph break) == eager."""
    T, H, I, E, k = 11, 128, 64, 8, 2
    x, w1, w2, _, _ = moe_problem(T, H, I, E, k, seed=4)
    g = randn((T, E), seed=5)
    kw = {}
    if scheme != "bf16":
        gran = "block" if scheme == "fp8_block" else "per_row"
        w1, s1 = moekit.quantize_fp8(w1.float(), gran)
        w2, s2 = moekit.quantize_fp8(w2.float(), gran)
        kw = dict(use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
                  block_shape=[128, 128] if scheme == "fp8_block" else None)

    def layer(x, g):
        w, ids, _ = moekit.fused_topk(x, g, k, True)
        return moekit.fused_experts(x, w1, w2, w, ids, **kw)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(x, g), layer(x, g))
    x2, g2 = randn((T, H), seed=6, dtype=torch.bfloat16), randn((T, E), seed=7)
    assert torch.equal(compiled(x2, g2), layer(x2, g2))


@requires_ops
def test_compile_dynamic_token_count():
    """One dynamic-shape graph serves every T, T = 0 included (the serving case)."""
    x0, w1, w2, _, _ = moe_problem(1, 64, 32, 8, 2, seed=14)

    def layer(x, g):
        w, ids, _ = moekit.fused_topk(x, g, 2, True)
        return moekit.fused_experts(x, w1, w2, w, ids)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for T in (3, 17, 40, 0):
        x, g = randn((T, 64), seed=T, dtype=torch.bfloat16), randn((T, 8), seed=T + 1)
        assert torch.equal(compiled(x, g), layer(x, g))


@requires_ops
def test_compile_fullgraph_grouped_and_sigmoid_routing():
    g = randn((9, 32), seed=8)
    bias = randn((32,), seed=9, scale=0.1)

    def route(g):
        w1, i1 = moekit.grouped_topk(g, g, 4, True, 4, 2, "sigmoid", 2.5, bias)
        w2, i2 = moekit.sigmoid_topk(g, 1)
        return w1, i1, w2, i2

    torch._dynamo.reset()
    for a, b in zip(torch.compile(route, fullgraph=True)(g), route(g)):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------- GPU only
@requires_cuda
@pytest.mark.parametrize("scheme", ["bf16", "fp8_row"])
def test_cuda_graph_capture_and_replay_with_changed_inputs(scheme):
    T, H, I, E, k = 16, 256, 128, 8, 2
    x, w1, w2, _, _ = moe_problem(T, H, I, E, k, seed=10, device="cuda")
    g = randn((T, E), seed=11, device="cuda")
    kw = {}
    if scheme == "fp8_row":
        w1, s1 = moekit.quantize_fp8(w1.float(), "per_row")
        w2, s2 = moekit.quantize_fp8(w2.float(), "per_row")
        kw = dict(use_fp8_w8a8=True, per_channel_quant=True, w1_scale=s1, w2_scale=s2)
    out = torch.empty_like(x)

    def step():
        w, ids, _ = moekit.fused_topk(x, g, k, True)
        moekit.fused_experts(x, w1, w2, w, ids, out=out, **kw)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture (first-use allocations, kernel selection)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(3):
        x.copy_(randn((T, H), seed=20 + seed, dtype=torch.bfloat16, device="cuda"))
        g.copy_(randn((T, E), seed=30 + seed, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        w, ids, _ = moekit.fused_topk(x, g, k, True)
        eager = moekit.fused_experts(x, w1, w2, w, ids, **kw)
        cpu_kw = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
        on_cpu = moekit.fused_experts(x.cpu(), w1.cpu(), w2.cpu(), w.cpu(), ids.cpu(), **cpu_kw)
        assert_close_lowp(replayed, eager)
        if scheme == "bf16":
            assert_close_lowp(replayed, on_cpu)
        else:
            assert_similar(replayed, on_cpu)


@requires_cuda
def test_cuda_compile_fullgraph_and_routing_matches_cpu():
    T, H, I, E, k = 40, 256, 128, 16, 4
    x, w1, w2, _, _ = moe_problem(T, H, I, E, k, seed=12, device="cuda")
    g = randn((T, E), seed=13, device="cuda")

    def layer(x, g):
        w, ids, _ = moekit.fused_topk(x, g, k, True)
        return moekit.fused_experts(x, w1, w2, w, ids)

    torch._dynamo.reset()
    assert_close_lowp(torch.compile(layer, fullgraph=True)(x, g), layer(x, g))
    w, ids, _ = moekit.fused_topk(x, g, k, True)
    wc, idc, _ = moekit.fused_topk(x.cpu(), g.cpu(), k, True)
    assert torch.equal(ids.cpu(), idc)
    torch.testing.assert_close(w.cpu(), wc, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ environment switches
def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120)


def test_use_fused_moe_off_routes_to_the_reference():
    pytest.importorskip("moekit.reference")
    code = (
        "import torch, moekit\n"
        "from moekit import reference as r\n"
        "assert moekit.USE_FUSED_MOE is False\n"
        "g = torch.randn(5, 8)\n"
        "w, i, t = moekit.fused_topk(g, g, 2, True)\n"
        "rw, ri, rt = r.ref_fused_topk(g, g, 2, True)\n"
        "assert torch.equal(w, rw) and torch.equal(i, ri) and torch.equal(t, rt)\n"
        "print('ok')\n")
    res = run_python(code, MOEKIT_USE_FUSED_MOE="0")
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_use_fused_moe_bad_value_is_an_error():
    res = run_python("import moekit", MOEKIT_USE_FUSED_MOE="maybe")
    assert res.returncode != 0 and "MOEKIT_USE_FUSED_MOE" in res.stderr


@requires_ops
def test_backend_and_print_dispatch_reach_the_library():
    code = (
        "import torch, moekit\n"
        "x = torch.randn(4, 64).bfloat16()\n"
        "w1 = torch.randn(2, 64, 64).bfloat16(); w2 = torch.randn(2, 64, 32).bfloat16()\n"
        "w, i, _ = moekit.fused_topk(x, torch.randn(4, 2), 1, True)\n"
        "moekit.fused_experts(x, w1, w2, w, i)\n")
    res = run_python(code, MOEKIT_BACKEND="ref", MOEKIT_PRINT_DISPATCH="1")
    assert res.returncode == 0, res.stderr
    assert "fused_moe_ref" in res.stdout + res.stderr and "topk_softmax_ref" in res.stdout + res.stderr
