"""moekit in forked children (issue 28): once the CPU thread pool runs in a process, a child made
by fork() (multiprocessing's fork start method, DataLoader workers, pre-forking servers) must get
working ops, not hang on pool threads that exist only in the parent. Each child has a deadline;
a hang fails the test instead of blocking the suite. The children run moekit calls only, on
tensors made by the parent: torch's own OpenMP pool is not fork-safe (a child's large torch op
hangs whether or not moekit was used), which is why DataLoader workers do the same.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

import moekit
from conftest import requires_ops

pytestmark = requires_ops


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T, H, I, E, k = 32, 128, 64, 8, 2
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w1 = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) * I ** -0.5).to(torch.bfloat16)
    logits = torch.randn(T, E, generator=g)
    return x, w1, w2, logits, k


def _run(problem):
    x, w1, w2, logits, k = problem
    weights, ids, _ = moekit.fused_topk(x, logits, k, True)
    return moekit.fused_experts(x, w1, w2, weights, ids)


def _child(queue, problem) -> None:
    queue.put(_run(problem).float().tolist())  # plain lists: no shared-memory handles across the fork


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork start method here")
def test_forked_children_run_fused_moe_after_the_parent_did():
    problem = _problem()
    expected = _run(problem)  # the parent's pool exists from here on
    ctx = mp.get_context("fork")
    for _ in range(2):
        queue = ctx.Queue()
        child = ctx.Process(target=_child, args=(queue, problem))  # inherited, not pickled
        child.start()
        try:
            got = queue.get(timeout=60)
        except Exception:  # queue.Empty: the child hung (or died) before it answered
            got = None
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
            child.join()
        assert got is not None, f"the forked child hung or died in its first moekit call (exit code {child.exitcode})"
        assert child.exitcode == 0
        torch.testing.assert_close(torch.tensor(got), expected.float(), rtol=0, atol=0)
    torch.testing.assert_close(_run(problem), expected, rtol=0, atol=0)  # the parent's pool still works
