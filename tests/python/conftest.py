"""Shared fixtures and generators of the moekit Python tests (tests/python/).

The tests run against the INSTALLED package (`pip install .`, or scripts/test_python.sh), never
the source tree: python/moekit has no extension until it is built. GPU cases run where CUDA is
available and the extension was built with the CUDA backend; they skip otherwise.
"""

from __future__ import annotations

import pytest
import torch

import moekit


def cuda_ops_available() -> bool:
    """True when a CUDA device exists and torch.ops.moekit has CUDA implementations."""
    if not torch.cuda.is_available() or not moekit.USE_FUSED_MOE:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key("moekit::fused_moe", "CUDA")


requires_cuda = pytest.mark.skipif(not cuda_ops_available(),
                                   reason="needs a CUDA device and a CUDA build of the extension")
requires_ops = pytest.mark.skipif(not moekit.USE_FUSED_MOE, reason="MOEKIT_USE_FUSED_MOE=0: the ops are off")

DEVICES = ["cpu"] + (["cuda"] if cuda_ops_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def reference():
    """moekit.reference (the pure-torch twins, ref_*); parity tests skip when it is absent."""
    return pytest.importorskip("moekit.reference")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, seed: int, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Deterministic normal data made on the CPU (same values on every device)."""
    return (torch.randn(shape, generator=gen(seed)) * scale).to(dtype).to(device)


def random_ids(T: int, k: int, E: int, seed: int, device="cpu") -> torch.Tensor:
    """[T, k] int32 of distinct expert ids per row."""
    ids = torch.rand((T, E), generator=gen(seed)).argsort(dim=1)[:, :k]
    return ids.to(torch.int32).to(device)


def moe_problem(T: int, H: int, I: int, E: int, k: int, seed: int, dtype=torch.bfloat16, device="cpu",
                gate_only: bool = False):
    """x [T, H], w1 [E, 2I (or I), H], w2 [E, H, I], topk_weights f32 [T, k], topk_ids int32 [T, k].

    Weights ~ N(0, 1/fan_in) so activations stay O(1) through both projections.
    """
    N1 = I if gate_only else 2 * I
    x = randn((T, H), seed, dtype, device)
    w1 = randn((E, N1, H), seed + 1, dtype, device, scale=H ** -0.5)
    w2 = randn((E, H, I), seed + 2, dtype, device, scale=I ** -0.5)
    w = torch.rand((T, k), generator=gen(seed + 3)).to(device)
    w = w / w.sum(dim=1, keepdim=True).clamp_min(1e-6)
    ids = random_ids(T, k, E, seed + 4, device)
    return x, w1, w2, w, ids


def assert_close_lowp(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1.6e-2) -> None:
    """bf16 / f16 outputs: elementwise within rel * (|expected| + max|expected|) (a few output ulps
    of the largest value: the two sides differ only in f32 summation order and the rounding of the
    intermediate that follows it). Prints the worst element's coordinates on failure."""
    a, e = actual.float().cpu(), expected.float().cpu()
    assert a.shape == e.shape, f"shape {list(a.shape)} != {list(e.shape)}"
    if e.numel() == 0:
        return
    bound = rel * (e.abs() + e.abs().max())
    err = (a - e).abs()
    worst = int((err - bound).flatten().argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), e.shape))
    assert bool((err <= bound).all()), (
        f"worst at {idx}: got {a[idx].item()}, expected {e[idx].item()}, bound {bound[idx].item()}")


def assert_similar(actual: torch.Tensor, expected: torch.Tensor, min_cos: float = 0.999,
                   max_rms_ratio: float = 0.05) -> None:
    """fp8 outputs: finite, cosine similarity and RMS of the difference relative to expected."""
    a, e = actual.double().cpu().flatten(), expected.double().cpu().flatten()
    assert torch.isfinite(a).all(), "non-finite output"
    if e.numel() == 0 or e.norm() == 0:
        assert a.abs().max() == 0 if a.numel() else True
        return
    cos = float(torch.dot(a, e) / (a.norm() * e.norm()).clamp_min(1e-30))
    rms = float((a - e).norm() / e.norm())
    assert cos >= min_cos and rms <= max_rms_ratio, f"cosine {cos:.6f}, rms ratio {rms:.4f}"
