"""The CPU kernels' thread count follows torch.get_num_threads() (issue 29: transformers users set
threads through torch), unless MOEKIT_NUM_THREADS fixes it; torch.ops.moekit.set_num_threads /
num_threads expose the library's setting (moekit/threads.h).
"""

from __future__ import annotations

import os

import pytest
import torch

import moekit
from conftest import requires_ops

pytestmark = [requires_ops,
              pytest.mark.skipif(bool(os.environ.get("MOEKIT_NUM_THREADS")), reason="MOEKIT_NUM_THREADS fixes it")]


def _call():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g)
    w1 = torch.randn(4, 64, 64, generator=g) * 0.1
    w2 = torch.randn(4, 64, 32, generator=g) * 0.1
    weights, ids, _ = moekit.fused_topk(x, torch.randn(8, 4, generator=g), 2, True)
    return moekit.fused_experts(x, w1, w2, weights, ids)


def test_cpu_threads_follow_torch_and_results_do_not_change():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _call()
        assert torch.ops.moekit.num_threads() == 1
        torch.set_num_threads(max(2, before))
        many = _call()
        assert torch.ops.moekit.num_threads() >= min(2, os.cpu_count() or 1)
        torch.testing.assert_close(one, many, rtol=0, atol=0)  # fixed partition per element
    finally:
        torch.set_num_threads(before)


def test_set_num_threads_rejects_zero():
    with pytest.raises(ValueError, match="n must be >= 1"):
        torch.ops.moekit.set_num_threads(0)
