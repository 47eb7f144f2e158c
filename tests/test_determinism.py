"""Determinism (issue #21 items 4-5): fresh processes, and 1 vs 2 threads, give the same bits on the
spectral paths (the in-house series, the fast path on HEALPix and on general sources), in 2 + 1
processes. The full table (10 + 3 processes, every path) is ``python validation/determinism.py``."""
import sys

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validation.determinism import compare  # noqa: E402


@pytest.mark.slow  # fresh processes (about 20 s): out of the default run, which must stay under 10 minutes
def test_fresh_processes_and_thread_counts_give_identical_bits(tmp_path):
    # before the fixes: the in-house series gave 4 distinct results in 12 fresh processes at one thread
    # (its moments loop was vectorised or not by a run-time alias check); the fast path on a tensor grid
    # gave 2 distinct results in 2 fresh processes at 2
    # threads (the NUFFT adjoint's parallel spreading), and the fast path's per-thread sums depended on
    # which thread ran which basis map
    res = compare(["spectral_inhouse", "spectral_fast", "tensor_fast"], runs=2, runs1=1, work=tmp_path)
    for name, r in res.items():
        assert r["distinct_default"] == 1 and r["same_across_threads"], (name, r)
    assert res["spectral_fast"]["path"].endswith("fast") and res["tensor_fast"]["path"].endswith("fast")
    assert res["spectral_inhouse"]["path"].endswith("inhouse")
