"""Diagnostics: alignment, interaction energy (vs a NumPy twin), the combined concentration diagnostics."""
import numpy as np
import pytest
from scipy.special import logsumexp

from spherepde.diagnostics import alignment, concentration_diagnostics, interaction_energy
from spherepde.particles import simulate_particles
from spherepde.sampling import sample_uniform
from spherepde.spectral import limit_measure, lyapunov_vp, spectral_data
from spherepde.wasserstein import wasserstein2

B_PAPER = np.diag([-1.0, -1.0, 1.0])
V_PAPER = np.diag([-1.0, 1.0, -2.0])


class FakeAttention:
    def __init__(self, B, V, beta):
        self.B, self.V, self.beta, self.dim = np.asarray(B, float), np.asarray(V, float), beta, len(B)


def test_alignment_values():
    x = np.array([[1.0, 0, 0], [0, 0.6, 0.8]])
    w = np.array([0.25, 0.75])
    assert alignment(x, w, [1.0, 0, 0]) == pytest.approx(0.25)
    assert alignment(x, w, [[0, 1.0, 0]]) == pytest.approx(0.75 * 0.36)
    assert alignment(x, w, np.eye(3)[1:]) == pytest.approx(0.75)
    u = sample_uniform(40000, 3, 0)
    # uniform on S^2: E|x_1|^2 = 1/3; 5 standard errors (sd of x_1^2 is 0.30)
    assert alignment(u, np.full(len(u), 1 / len(u)), [1.0, 0, 0]) == pytest.approx(1 / 3, abs=5 * 0.3 / 200)
    with pytest.raises(ValueError, match="orthonormal rows"):
        alignment(x, w, [[1.0, 1.0, 0]])


def twin_log_energy(x, w, B, beta):
    return logsumexp(beta * x @ B @ x.T + np.log(w)[:, None] + np.log(w)[None, :])


@pytest.mark.parametrize("beta", [0.0, 1.0, 50.0, 1e4])
def test_interaction_energy_matches_twin(beta):
    rng = np.random.default_rng(1)
    x = sample_uniform(300, 3, rng)
    w = rng.random(300)
    B = rng.standard_normal((3, 3))
    # log-sum-exp of values up to beta |B| ~ 3e4: relative rounding ~1e-16 of the largest term
    assert interaction_energy(x, w, B, beta, log=True) == pytest.approx(twin_log_energy(x, w, B, beta),
                                                                       rel=1e-13, abs=1e-12)
    if beta <= 1.0:
        direct = np.sum(w[:, None] * w[None, :] * np.exp(beta * x @ B @ x.T))
        assert interaction_energy(x, w, B, beta) == pytest.approx(direct, rel=1e-13)


def test_interaction_energy_overflow_handled():
    x = sample_uniform(20, 3, 2)
    w = np.full(20, 0.05)
    with pytest.raises(OverflowError, match="log=True"):  # exp(~1e4) overflows: an error saying what to do
        interaction_energy(x, w, np.eye(3), 1e4)
    assert np.isfinite(interaction_energy(x, w, np.eye(3), 1e4, log=True))
    # a single Dirac: E = exp(beta <x, B x>) exactly
    assert interaction_energy([[0.0, 0.0, 1.0]], [1.0], np.eye(3), 800.0, log=True) == pytest.approx(800.0)


def test_energy_increases_along_flow_for_B_equal_V():
    # Appendix C.3: for B = V (symmetric) the dynamics increase E_B
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    B = Q @ np.diag([1.0, 0.3, -0.5]) @ Q.T
    x0 = sample_uniform(100, 3, rng)
    res = simulate_particles(FakeAttention(B, B, 2.0), x0, 3.0, 0.02, method="rk4",
                             save_at=np.linspace(0, 3, 13))
    e = [interaction_energy(x, res.weights, B, 2.0, log=True) for x in res.positions]
    assert np.all(np.diff(e) > 0), e
    # and for B = -V it decreases
    res = simulate_particles(FakeAttention(B, -B, 2.0), x0, 3.0, 0.02, method="rk4",
                             save_at=np.linspace(0, 3, 13))
    e = [interaction_energy(x, res.weights, B, 2.0, log=True) for x in res.positions]
    assert np.all(np.diff(e) < 0), e


def test_concentration_diagnostics_paper_setting():
    x0 = sample_uniform(400, 3, 4)
    w = np.full(400, 1 / 400)
    s = spectral_data(B_PAPER, V_PAPER)
    lim = limit_measure(x0, w, B_PAPER, V_PAPER)
    d0 = concentration_diagnostics(x0, w, B_PAPER, V_PAPER, p=0.25, limit=lim)
    assert set(d0) >= {"w2_limit", "alignment_E", "alignment_F", "alignment_F_abs", "V_p", "mass", "p"}
    assert d0["w2_limit"] == pytest.approx(wasserstein2(x0, w, *lim))
    assert d0["alignment_E"] == pytest.approx(alignment(x0, w, [1.0, 0, 0]))
    assert d0["V_p"] == pytest.approx(lyapunov_vp(x0, w, s.E, 0.25))
    # zero temperature: tokens concentrate on +-e1, so W2 to Pi#rho_0 and V_p fall, alignment with E -> 1
    from spherepde.models import ZeroTemperature

    xt = simulate_particles(ZeroTemperature(B_PAPER, V_PAPER), x0, 4.0, 0.01, method="rk4").positions[-1]
    d1 = concentration_diagnostics(xt, w, B_PAPER, V_PAPER, p=0.25, limit=lim, spectral=s)
    assert d1["w2_limit"] < 0.1 * d0["w2_limit"]
    assert d1["V_p"] < 0.1 * d0["V_p"] and d1["alignment_E"] > 0.99
    # Corollary 2 at t = 0 and t: W2(rho, Pi#rho)^2 <= 2 V_p(rho) for the same measure's limit
    for xx in (x0, xt):
        assert wasserstein2(xx, w, *limit_measure(xx, w, B_PAPER, V_PAPER)) ** 2 <= 2 * lyapunov_vp(xx, w, s.E, 1.0,
                                                                                                 strict=False)
    with pytest.raises(ValueError, match="V_p is infinite"):
        concentration_diagnostics(x0, w, B_PAPER, V_PAPER, p=0.5)


def test_concentration_diagnostics_grid_vp():
    """A HEALPix density: with ``grid`` V_p integrates the singular weight over each cell (exact for the
    uniform density: B(1/2 - p, 1 + p)/2 = 1.8541 at p = 0.25, to round-off); the sum over the centres
    is dominated by the centres on E^perp (x1 = 6e-17)."""
    from scipy.special import beta

    from spherepde import HealpixGrid

    g = HealpixGrid(4)
    w = np.full(g.n_cells, 1.0 / g.n_cells)
    d = concentration_diagnostics(g.centers, w, B_PAPER, V_PAPER, p=0.25, grid=g)
    assert d["V_p"] == pytest.approx(0.5 * beta(0.25, 1.25), rel=1e-12)
    # HEALPix centres are recognised as the grid's density (the centre sum over atoms gave 2e6 here)
    assert concentration_diagnostics(g.centers, w, B_PAPER, V_PAPER, p=0.25)["V_p"] == d["V_p"]
