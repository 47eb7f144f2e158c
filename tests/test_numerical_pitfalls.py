"""Issue #20 item 3: silent numerical pitfalls (narrow initial densities, V_p on cell centres,
concentration_diagnostics defaults, the W2 floor at grid resolution)."""
import warnings

import numpy as np
import pytest

from spherepde import HealpixGrid
from spherepde.config import InitialConfig
from spherepde.diagnostics import W2_FLOOR_FACTOR, concentration_diagnostics, w2_grid_floor
from spherepde.grids.tensor import TensorGrid
from spherepde.sampling import sample_vmf
from spherepde.spectral import limit_measure, lyapunov_vp, lyapunov_vp_uniform

B_PAPER = np.diag([-1.0, -1.0, 1.0])
V_PAPER = np.diag([-1.0, 1.0, -2.0])


def _vmf(mean, kappa, **kw):
    return InitialConfig.parse({"type": "vmf_mixture", "means": [mean], "kappas": [kappa], **kw}, 3)


@pytest.mark.parametrize("nside, kappa", [(8, 1e5), (16, 1e6)])
def test_narrow_vmf_cell_averages_have_mass_one_and_the_right_cells(nside, kappa):
    # the fixed 32-point rule gave mass 0.661 and 0.081 here (mean e2: the nodes miss the peak)
    g = HealpixGrid(nside)
    mu = np.array([0.0, 1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = _vmf(mu.tolist(), kappa).build(g)
    # 1e-12: the adaptive rule's budget is 1e-13 of the total (the estimate is of the parent rule, the
    # children's sum is kept); the sum of 768 or 3072 cells adds ~1e-16
    assert abs(g.mass(f) - 1.0) < 1e-12
    # the distribution over cells: the cells around the mean against an independent reference, 2e6
    # samples binned by cell (5 standard errors of a binomial proportion, + 1e-4 for the cell-size noise)
    n = 2_000_000
    counts = np.bincount(g.cell_of(sample_vmf(n, mu, kappa, rng=3)), minlength=g.n_cells) / n
    m = f * g.areas
    near = np.flatnonzero(counts > 1e-4)
    assert m[near].sum() > 0.999
    assert np.all(np.abs(m[near] - counts[near]) <= 5 * np.sqrt(counts[near] * (1 - counts[near]) / n) + 1e-4)


def test_narrow_vmf_on_a_tensor_grid_at_the_pole():
    g = TensorGrid(3, 16)
    f = _vmf([0.0, 0.0, 1.0], 1e6, uniform_weight=0.1).build(g)
    assert abs(g.mass(f) - 1.0) < 1e-12  # the fixed rule: mass 0.38 at kappa 1e4 (n = 32)


def test_broad_densities_keep_the_fixed_rule():
    g = HealpixGrid(8)
    ic = _vmf([0.3, 0.5, 0.8], 10.0, uniform_weight=0.2)  # width 0.32 > 2 cell widths (0.128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(ic.build(g), g.cell_average(ic.density(3)))


def test_centre_values_of_a_narrow_density_warn():
    g = HealpixGrid(8)
    with pytest.warns(RuntimeWarning, match='kappas\\[0\\] = 100000.*sample = "average"'):
        _vmf([0.0, 1.0, 0.0], 1e5, sample="center").build(g)


def test_lyapunov_vp_on_cell_centres_warns_and_the_grid_path_is_exact():
    g = HealpixGrid(8)
    w = np.full(g.n_cells, 1.0 / g.n_cells)
    E = np.eye(3)[:1]
    # the centre sum was 3e12 at p = 0.45 (centres on E^perp to round-off, |P_E x| = 6e-17)
    with pytest.warns(RuntimeWarning, match="grid="):
        assert lyapunov_vp(g.centers, w, E, 0.45) == np.inf
    # exact up to the cell integrals' quadrature (1e-9 relative, tests/test_spectral.py)
    assert lyapunov_vp(g.centers, w, E, 0.45, grid=g) == pytest.approx(lyapunov_vp_uniform(3, 1, 0.45), rel=1e-9)


def test_concentration_diagnostics_defaults_are_finite_and_right():
    g = HealpixGrid(8)
    w = np.full(g.n_cells, 1.0 / g.n_cells)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = concentration_diagnostics(g.centers, w, B_PAPER, V_PAPER)  # was V_p = 2.2e6, w2_limit = NaN
    assert d["V_p"] == pytest.approx(lyapunov_vp_uniform(3, 1, 0.25), rel=1e-9)
    lim = limit_measure(g.centers, w, B_PAPER, V_PAPER)
    ref = concentration_diagnostics(g, w, B_PAPER, V_PAPER, limit=lim)
    assert np.isfinite(d["w2_limit"]) and d["w2_limit"] == pytest.approx(ref["w2_limit"], rel=1e-12)
    assert d["V_p"] == ref["V_p"]
    # Corollary 2 at t = 0: W2(rho, Pi#rho)^2 <= 2 V_p(rho)
    assert d["w2_limit"] ** 2 <= 2 * d["V_p"]


def test_w2_floor_flags_the_grid_resolution_plateau():
    g = HealpixGrid(16)
    e = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    floor = w2_grid_floor(g, e, [0.5, 0.5])
    assert floor == pytest.approx(np.min(np.linalg.norm(g.centers - e[0], axis=1)), rel=1e-12)
    # the density concentrated on the cells nearest +-e1 (the default run's end state) sits on the floor
    dist = np.minimum(np.linalg.norm(g.centers - e[0], axis=1), np.linalg.norm(g.centers + e[0], axis=1))
    w = np.where(dist < 1.2 * floor, 1.0, 0.0)
    w /= w.sum()
    lim = (e, np.array([0.5, 0.5]))
    d = concentration_diagnostics(g, w, B_PAPER, V_PAPER, limit=lim)
    assert floor <= d["w2_limit"] <= W2_FLOOR_FACTOR * floor and d["w2_at_floor"] and d["w2_floor"] == floor
    u = concentration_diagnostics(g, np.full(g.n_cells, 1.0 / g.n_cells), B_PAPER, V_PAPER, limit=lim)
    assert not u["w2_at_floor"] and u["w2_limit"] > 10 * floor
    # particles have no floor
    x = sample_vmf(50, [1.0, 0.0, 0.0], 1e4, rng=0)
    p = concentration_diagnostics(x, np.full(50, 0.02), B_PAPER, V_PAPER, limit=lim)
    assert p["w2_floor"] == 0.0 and not p["w2_at_floor"]
