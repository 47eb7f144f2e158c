"""Noise (issue #18 item 1): the Fokker-Planck term (sigma^2 / 2) Delta_S f of the PDE and Brownian tokens.

Exact references: the heat semigroup (a spherical harmonic of degree l decays as exp(-D l (l + 1) t) on S^2,
a Fourier mode k as exp(-D k^2 t) on S^1, D = sigma^2 / 2), the Gibbs state exp(U / D) of a gradient field
grad U plus noise, and E[X_t] = exp(-(d - 1) D t) X_0 of Brownian motion on S^(d-1).
"""
import numpy as np
import pytest

import spherepde as sp
from spherepde.diffusion import DiffusionOperators, heat_flow, laplacian

SIG = 0.6
D = SIG ** 2 / 2


def _l1_rel(g, a, b):
    return g.mass(np.abs(a - b)) / g.mass(np.abs(b))


def _order(errs):
    return [float(np.log2(a / b)) for a, b in zip(errs, errs[1:])]


@pytest.mark.parametrize("name, Y, lam", [
    ("Y_2^1 ~ xz", lambda x: x[:, 0] * x[:, 2], 6),
    ("degree 4 (x^4 + y^4 + z^4 - 3/5)", lambda x: x[:, 0] ** 4 + x[:, 1] ** 4 + x[:, 2] ** 4 - 0.6, 20),
])
def test_heat_semigroup_on_s2_second_order(name, Y, lam):
    # f0 = 1/(4 pi) + 0.05 Y: the Y part decays at exactly exp(-D lam t). The two-point flux alone does not
    # converge on HEALPix (60 % error on Y_2 at every nside, measured); the corrected flux converges at
    # order 2.08 (xz) and 1.91 (degree 4) between nside 16 and 32 (measured); 1.8 is the suite's threshold
    # for second-order schemes. Mass to round-off.
    errs = []
    for ns in (8, 16, 32):
        g = sp.HealpixGrid(ns)
        y = g.cell_average(Y)
        r = sp.solve(g, sp.Noise(SIG), lambda x: 1 / (4 * np.pi) + 0.05 * Y(x), 0.5, save_at=[0.0, 0.25, 0.5])
        amp = 0.05 * np.exp(-D * lam * 0.5)
        errs.append(_l1_rel(g, r.density[-1] - 1 / (4 * np.pi), amp * y))
        assert abs(g.mass(r.density[-1]) - g.mass(r.density[0])) < 1e-14
    assert _order(errs)[-1] >= 1.8, errs
    assert errs[-1] < 2.5e-3


def test_heat_semigroup_on_s1_second_order():
    # the circle's faces are points: the two-point flux is the consistent one; orders 2.00 measured
    for k in (1, 3):
        errs = []
        for n in (32, 64, 128):
            g = sp.TensorGrid(2, n)

            def Y(x):
                return np.cos(k * np.arctan2(x[:, 1], x[:, 0]) + 0.3)

            r = sp.solve(g, sp.Noise(SIG, dim=2), lambda x: 1 / (2 * np.pi) + 0.05 * Y(x), 0.5)
            errs.append(_l1_rel(g, r.density[-1] - 1 / (2 * np.pi), 0.05 * np.exp(-D * k * k * 0.5) * g.cell_average(Y)))
        assert min(_order(errs)) >= 1.9, (k, errs)


def test_the_two_point_flux_alone_is_inconsistent_on_healpix():
    # why the correction is there: the two-point operator's error on Y_2 does not fall with h
    errs = []
    for ns in (8, 16, 32):
        g = sp.HealpixGrid(ns)
        y = g.cell_average(lambda x: x[:, 0] * x[:, 2])
        errs.append([_l1_rel(g, laplacian(g, corrected=c) @ y, -6 * y) for c in (False, True)])
    tpfa, corr = np.array(errs).T
    assert tpfa.min() > 0.3 and tpfa[-1] > tpfa[0]  # 33 %, 39 %, 44 % measured
    assert corr[-1] < 0.5 * corr[0]  # first order for the operator, second for the flow (above)


def test_gibbs_state_of_a_gradient_field_plus_noise():
    # v = P_x(M x) = grad_S U with U = <x, M x> / 2 (M symmetric): the stationary density is
    # exp(U / D) / Z. From uniform f0 the run reaches it to the discretisation error (the same at t = 4 and
    # t = 6), which falls at order 1.61 (nside 4 -> 8) and 1.84 (8 -> 16), measured.
    M = np.diag([1.0, 0.3, -0.5])
    sig = 1.0
    d_ = sig ** 2 / 2
    errs = []
    for ns in (4, 8, 16):
        g = sp.HealpixGrid(ns)
        r = sp.solve(g, sp.Prescribed.linear(M) + sp.Noise(sig), lambda x: np.full(len(x), 1 / (4 * np.pi)), 6.0,
                     save_at=[0.0, 4.0, 6.0])
        q = g.cell_average(lambda x: np.exp(np.einsum("ij,jk,ik->i", x, M, x) / (2 * d_)))
        q /= g.mass(q)
        e4, e6 = (g.mass(np.abs(r.density[i] - q)) for i in (1, 2))
        assert abs(e4 - e6) < 0.05 * e6  # stationary
        errs.append(e6)
        assert r.diagnostics["min"].min() > 0 and abs(g.mass(r.density[-1]) - 1) < 1e-13
    assert _order(errs)[-1] >= 1.7, errs
    assert errs[-1] < 5e-4


def test_transport_plus_noise_is_second_order_in_time():
    # Strang splitting (noise dt/2, transport dt, noise dt/2, the noise flows exact): order 2 whatever the
    # stepper (SSP-RK3 is limited to 2 by the splitting; stated in the docs). Fixed steps against a 16x
    # smaller step on the same grid; measured 1.99-2.00 at nside 8 for SSP-RK2 and SSP-RK3 alike.
    stepper = "ssprk3"
    M = np.array([[0.2, 1.0, 0.3], [-0.8, 0.1, 0.5], [0.3, -0.4, -0.6]])  # not a gradient: does not commute
    g = sp.HealpixGrid(4)

    def f0(x):
        return (1 + 0.5 * x[:, 0] + 0.3 * x[:, 1] * x[:, 2]) / (4 * np.pi)

    model = sp.Prescribed.linear(M) + sp.Noise(0.8)

    def run(cfl):
        return sp.solve(g, model, f0, 1.0, options=sp.Options(error_control=False, cfl=cfl, stepper=stepper))

    ref = run(0.4 / 16).density[-1]
    errs = [g.mass(np.abs(run(c).density[-1] - ref)) for c in (0.4, 0.2, 0.1)]
    assert min(_order(errs)) >= 1.9, errs


def test_heat_flow_stays_positive_where_the_consistent_flux_would_not():
    # a density on one cell: the corrected operator's flow has negative cells; heat_flow sets them to 0 and
    # scales the rest back to the mass, an L1 change of at most twice the negative mass (recorded)
    g = sp.HealpixGrid(8)
    ops = DiffusionOperators(g)
    f = np.zeros(g.n_cells)
    f[100] = 1.0 / g.areas[100]
    from scipy.sparse.linalg import expm_multiply

    raw = expm_multiply(1e-3 * ops.L, f)
    neg = -float(np.minimum(raw, 0) @ g.areas)
    assert raw.min() < 0 and neg > 1e-6  # what the fix is for
    u = heat_flow(ops, f, 1e-3, 1.0)
    assert ops.n_clipped == 1 and u.min() >= 0.0 and ops.clipped_mass == pytest.approx(neg, rel=1e-6)
    assert abs(g.mass(u) - 1.0) < 1e-14
    assert g.mass(np.abs(u - raw)) <= 2 * neg * (1 + 1e-9)
    smooth = heat_flow(ops, np.full(g.n_cells, 1 / (4 * np.pi)) + 0.01 * g.centers[:, 2], 0.1, 1.0)
    assert ops.n_clipped == 1 and smooth.min() > 0  # a resolved density is left alone
    # in a run: attention plus noise from a narrow vMF stays >= 0, mass to round-off
    r = sp.solve(g, sp.Attention(np.eye(3), np.eye(3), 5.0) + sp.Noise(0.3),
                 lambda x: sp.config.vmf_density(x, [1, 0, 0], 400.0), 0.5)
    assert r.diagnostics["min"].min() >= 0.0
    assert abs(g.mass(r.density[-1]) - g.mass(r.density[0])) < 1e-13


def test_brownian_tokens_weak_order_one_and_seeded():
    # E[<X_t, e3>] = exp(-2 D t) on S^2 from X_0 = e3; projected Euler-Maruyama has weak order 1: measured
    # errors 0.0556, 0.0329, 0.0180 at dt = 0.1, 0.05, 0.025 (400k tokens: Monte Carlo sd 5e-4)
    sig, T, n = 1.0, 0.5, 400_000
    x0 = np.tile([0.0, 0.0, 1.0], (n, 1))
    exact = np.exp(-sig ** 2 / 2 * 2 * T)
    errs = []
    for dt in (0.1, 0.05, 0.025):
        p = sp.simulate_particles(sp.Noise(sig), x0, T, dt, seed=1)
        errs.append(p.positions[-1][:, 2].mean() - exact)
        assert np.allclose(np.linalg.norm(p.positions[-1], axis=1), 1.0, atol=1e-14)
    assert all(e > 0 for e in errs)
    assert min(a / b for a, b in zip(errs, errs[1:])) > 1.5  # halving dt nearly halves the bias
    small = sp.simulate_particles(sp.Attention(np.eye(3), np.eye(3), 2.0) + sp.Noise(0.5), x0[:50], 0.2, 0.01,
                                  seed=3)
    again = sp.simulate_particles(sp.Attention(np.eye(3), np.eye(3), 2.0) + sp.Noise(0.5), x0[:50], 0.2, 0.01,
                                  seed=3)
    other = sp.simulate_particles(sp.Attention(np.eye(3), np.eye(3), 2.0) + sp.Noise(0.5), x0[:50], 0.2, 0.01,
                                  seed=4)
    assert np.array_equal(small.positions, again.positions) and not np.array_equal(small.positions, other.positions)
    assert small.method == "euler-maruyama"


def test_noise_bad_input_is_named():
    with pytest.raises(ValueError, match="sigma"):
        sp.Noise(-1.0)
    with pytest.raises(ValueError, match="sigma"):
        sp.Noise(float("nan"))
    x0 = sp.sample_uniform(10, 3, rng=0)
    with pytest.raises(ValueError, match="method='euler'"):
        sp.simulate_particles(sp.Noise(0.1), x0, 0.1, 0.01, method="rk4")
    with pytest.raises(ValueError, match="rtol=None"):
        sp.simulate_particles(sp.Noise(0.1), x0, 0.1, 0.01, rtol=1e-6)
    m = sp.Attention(np.eye(2), np.eye(2), 1.0) + sp.Noise(0.2)
    assert m.dim == 2 and m.terms[1].dim == 2  # the noise takes the dimension of the terms it joins


def test_a_noisy_run_resumes_bit_for_bit():
    g = sp.HealpixGrid(4)
    model = sp.Attention(np.diag([-1.0, -1, 1]), np.diag([-1.0, 1, -2]), 4.0) + sp.Noise(0.4)

    def f0(x):
        return (1 + 0.3 * x[:, 0] * x[:, 1]) / (4 * np.pi)

    a = sp.Solver(g, model, f0)
    a.advance(0.5)
    b = sp.Solver(g, model, f0)
    for _ in range(5):
        b.step()
    c = sp.Solver(g, model, f0)
    c.set_state(b.get_state())
    c.advance(0.5)
    assert c.n_steps == a.n_steps and np.array_equal(c.f, a.f)


def test_noise_in_a_config_runs_with_tokens_and_reloads(tmp_path):
    from spherepde.cli import main

    cfg = tmp_path / "noisy.toml"
    cfg.write_text('''name = "noisy"
[grid]
type = "healpix"
nside = 4
[model]
type = "sum"
terms = [{type = "attention", B = "paper", V = "paper", beta = 5.0}, {type = "noise", sigma = 0.5}]
[time]
t_end = 0.3
save_at = [0.0, 0.3]
[particles]
n = 50
dt = 0.01
[output]
plots = []
''')
    assert main(["-q", "run", str(cfg), "--output", str(tmp_path / "o")]) == 0
    r = sp.load(tmp_path / "o" / "results.h5")
    assert isinstance(r.model, sp.Sum) and isinstance(r.model.terms[1], sp.Noise) and r.model.terms[1].sigma == 0.5
    p = r.metadata["particles"]["positions"]
    assert not np.allclose(p[-1], p[0])
    bad = cfg.read_text().replace("sigma = 0.5", "sigma = -0.5")
    cfg.write_text(bad)
    assert main(["-q", "run", str(cfg), "--check"]) == 2


def test_heat_semigroup_on_an_adaptive_grid_second_order():
    """Noise on mixed cells (issue #18 item 1 "every grid"): nside n with a cap refined to 2n, both refined
    together; the Y_2^1 part decays at exp(-6 D t). Measured L1 errors 4.4e-3, 1.05e-3, 2.6e-4 (orders 2.08,
    2.04), mass to round-off; 1.8 is the suite's threshold for second-order schemes."""
    from spherepde.grids.adaptive import AdaptiveHealpixGrid

    def Y(x):
        return x[:, 0] * x[:, 2]

    errs = []
    for ns in (8, 16, 32):
        g = AdaptiveHealpixGrid(ns, 2 * ns, refinement=False).refined_where(
            lambda gr: gr.centers @ np.array([0.6, 0.0, 0.8]) > 0.5)
        assert len(np.unique(g.order)) == 2
        r = sp.solve(g, sp.Noise(SIG), lambda x: 1 / (4 * np.pi) + 0.05 * Y(x), 0.5)
        errs.append(_l1_rel(g, r.density[-1] - 1 / (4 * np.pi), 0.05 * np.exp(-D * 6 * 0.5) * g.cell_average(Y)))
        assert abs(g.mass(r.density[-1]) - g.mass(r.density[0])) < 1e-14
    assert min(_order(errs)) >= 1.8, errs
