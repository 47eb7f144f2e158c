"""Quick modes of the issue-4 validation studies (validation/pde_vs_particles, corollary2_rate, min_density).

Each test runs a study's ``main`` at tiny resolution into a temporary folder and asserts what the study
establishes. The full runs and their measured results are in the studies' README.md files.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "validation"


def _load(study):
    spec = importlib.util.spec_from_file_location(f"_val_{study}", ROOT / study / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _w2(out, n, t):
    return next(r["W2"] for r in out["w2"] if r["n"] == n and abs(r["t"] - t) < 1e-9)


# ------------------------------------------------------------------ min density vs Gronwall
@pytest.mark.slow  # a study run (14-20 s on a clean checkout): out of the default run, which must stay under 10 minutes
def test_min_density_quick(tmp_path):
    """nside 8 to t = 6 (the +-e1 clusters become narrower than a cell): with limiter="maximum" min f_t stays
    above the Gronwall bound for every beta (measured: min ratio 1.165-1.168, at t ~ 0.03); with the
    positivity limiter alone it falls below (measured min ratios 0.0 / 0.09 / 0.49 / 0.67 for beta =
    10 / 100 / 1000 / inf), which is why the study needs the maximum limiter."""
    mod = _load("min_density")
    out = mod.main(["--quick", "--out", str(tmp_path)])
    assert set(out["runs"]) == {"maximum", "positivity"}
    for lim, runs in out["runs"].items():
        assert set(runs) == {"10", "100", "1000", "inf"}, lim
        for b, r in runs.items():
            assert r["min_f_end"] > 0, (lim, b)
            assert r["mass_drift"] < 1e-10, (lim, b)
            assert r["bound_end"] < 1e-9 * r["min_f0"]  # the bound does decay (sup div ~ 4 over t = 6)
    for b, r in out["runs"]["maximum"].items():
        # min f_t >= bound up to MAX_RATIO_TOL = 1e-3 (the time integrator's share; measured: no step < 1)
        assert r["min_ratio"] >= 1.0 - mod.MAX_RATIO_TOL, (b, r["min_ratio"])
        assert r["n_violations_beyond_tol"] == 0, b
    # the comparison the study documents: the positivity limiter alone violates the bound
    assert min(r["min_ratio"] for r in out["runs"]["positivity"].values()) < 0.9
    assert (tmp_path / "results.md").exists() and (tmp_path / "min_density.png").exists()


# ------------------------------------------------------------------ Corollary 2 at beta = inf
def _check_corollary2(out, rate_tol):
    for ns, r in out["runs"].items():
        w2 = np.array(r["w2"])
        assert np.all(np.diff(w2) < 0), ns  # W2(rho_t, Pi#rho_0) decreases monotonically
        assert w2[-1] < 0.3 * w2[0]
        np.testing.assert_allclose(r["atom_weights"], [0.5, 0.5], atol=1e-12)
        t = np.array(r["times"])
        for p, v in r["vp"].items():
            vals = np.array(v["values"])
            assert np.all(np.diff(vals) < 0), (ns, p)  # V_p decays
            # the grid path of lyapunov_vp is exact for the uniform f0 (round-off: measured 1e-15)
            assert abs(vals[0] / out["vp0_exact"][str(float(p))] - 1) < 1e-12, (ns, p, vals[0])
            # Corollary 2 bound, with V_p(rho_0) exact for the uniform density
            bound = np.sqrt(2 * out["vp0_exact"][str(float(p))]) * np.exp(-float(p) * 2.0 * t)
            assert np.all(w2 <= bound * (1 + 1e-9)), (ns, p)
        # the V_p rate for p = 0.25 is the theory's 2 p gamma / sigma_max = 1 (sharp for this model)
        assert abs(r["vp"]["0.25"]["rate"] - 1.0) < rate_tol, r["vp"]["0.25"]["rate"]
        # the W2 rate exceeds the bound's p gamma / sigma_max for p = 0.25 (continuum rate: 1)
        assert r["w2_rate"] > 0.5


def test_corollary2_quick_nside8(tmp_path):
    out = _load("corollary2_rate").main(["--quick", "--nside", "8", "--out", str(tmp_path)])
    _check_corollary2(out, rate_tol=0.15)


@pytest.mark.slow
def test_corollary2_quick(tmp_path):
    out = _load("corollary2_rate").main(["--quick", "--out", str(tmp_path)])
    _check_corollary2(out, rate_tol=0.1)
    assert (tmp_path / "corollary2_rate.png").exists()


# ------------------------------------------------------------------ PDE vs particles
def test_pde_vs_particles_tiny(tmp_path):
    out = _load("pde_vs_particles").main(
        ["--quick", "--nside", "8", "--n", "250", "4000", "--t-end", "0.5", "--out", str(tmp_path)])
    for t in (0.0, 0.5):
        assert _w2(out, 4000, t) < 0.8 * _w2(out, 250, t), t


@pytest.mark.slow
def test_pde_vs_particles_quick(tmp_path):
    out = _load("pde_vs_particles").main(["--quick", "--out", str(tmp_path)])
    for t in (0.0, 0.5):
        assert _w2(out, 1000, t) < _w2(out, 250, t)
        assert _w2(out, 4000, t) < 0.6 * _w2(out, 250, t), t
        assert out["slope_vs_n"][f"{t:g}"] < -0.2
    assert (tmp_path / "pde_vs_particles.png").exists()
