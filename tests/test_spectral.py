"""Spectral objects, Assumption 1, Pi, the limit measure Pi#rho and V_p."""
import numpy as np
import pytest

from spherepde.sampling import sample_uniform
from spherepde.spectral import limit_measure, lyapunov_vp, projection, spectral_data

B_PAPER = np.diag([-1.0, -1.0, 1.0])
V_PAPER = np.diag([-1.0, 1.0, -2.0])


def same_subspace(basis, vectors):
    P = basis.T @ basis
    Q = np.atleast_2d(vectors).T @ np.atleast_2d(vectors)
    return np.allclose(P, Q, atol=1e-12)


def test_paper_matrices():
    s = spectral_data(B_PAPER, V_PAPER)
    np.testing.assert_array_equal(s.A, np.diag([1.0, -1.0, -2.0]))
    assert s.mu1 == 1.0 and s.mu2 == -1.0 and s.gamma == 2.0 and s.k == 1
    np.testing.assert_allclose(s.E, [[1.0, 0.0, 0.0]])  # sign convention: largest entry positive
    assert same_subspace(s.F, [0.0, 1.0, 0.0])
    assert same_subspace(s.F_abs, [0.0, 0.0, 1.0])
    np.testing.assert_allclose(s.P_E, np.diag([1.0, 0.0, 0.0]))
    assert s.sigma_max == 1.0 and s.assumption1 and s.failures() == []
    assert s.check() is s


def test_rotated_pair_and_degenerate_top():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    A = Q @ np.diag([3.0, 3.0, 0.5, -1.0]) @ Q.T
    B = rng.standard_normal((4, 4)) + 3 * np.eye(4)
    V = A @ np.linalg.inv(B.T)
    s = spectral_data(B, V).check()
    assert s.k == 2 and np.isclose(s.mu1, 3.0) and np.isclose(s.mu2, 0.5) and np.isclose(s.gamma, 2.5)
    assert same_subspace(s.E, Q[:, :2].T)
    assert np.isclose(s.sigma_max, np.linalg.svd(B, compute_uv=False)[0])


def test_gamma_infinite_when_A_is_multiple_of_identity():
    s = spectral_data(np.eye(3), 2 * np.eye(3))
    assert s.gamma == np.inf and s.mu2 == -np.inf and s.k == 3 and s.mu1 == 2.0


def test_assumption1_failures_are_named():
    singular = spectral_data(np.diag([1.0, 1.0, 0.0]), np.eye(3))
    assert not singular.B_invertible and singular.A_symmetric and not singular.assumption1
    with pytest.raises(ValueError, match="Assumption 1 fails: B is not invertible") as e:
        singular.check()
    assert "not symmetric" not in str(e.value)
    V = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    nonsym = spectral_data(np.eye(3), V)
    assert nonsym.B_invertible and not nonsym.A_symmetric
    with pytest.raises(ValueError, match=r"A = V B\^T is not symmetric") as e:
        nonsym.check()
    assert "invertible" not in str(e.value)
    both = spectral_data(np.diag([1.0, 1.0, 0.0]), V)
    assert len(both.failures()) == 2


def test_F_for_nonsymmetric_V_with_complex_top_pair():
    # rotation-scaling block with eigenvalues 2 +- i on span(e1, e2), 1 on e3: F is that real plane
    V = np.array([[2.0, -1.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    s = spectral_data(np.eye(3), V)
    assert same_subspace(s.F, np.eye(3)[:2]) and same_subspace(s.F_abs, np.eye(3)[:2])


def test_projection_and_perp_error():
    E = np.array([[1.0, 0.0, 0.0]])
    x = np.array([[0.6, 0.8, 0.0], [-0.6, 0.0, 0.8]])
    np.testing.assert_allclose(projection(x, E), [[1.0, 0, 0], [-1.0, 0, 0]])
    with pytest.raises(ValueError, match="undefined on E\\^perp: 1 point"):
        projection(np.array([[0.0, 1.0, 0.0], [1.0, 0, 0]]), E)


def test_limit_measure_k1_hemisphere_masses():
    x = sample_uniform(1000, 3, 3)
    w = np.random.default_rng(4).random(1000)
    pts, wts = limit_measure(x, w, B_PAPER, V_PAPER)
    np.testing.assert_allclose(pts, [[1.0, 0, 0], [-1.0, 0, 0]])
    assert wts[0] == pytest.approx(w[x[:, 0] > 0].sum(), rel=1e-14)
    assert wts[1] == pytest.approx(w[x[:, 0] < 0].sum(), rel=1e-14)
    # mass exactly on E^perp is split equally
    pts, wts = limit_measure([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [0.4, 0.6], B_PAPER, V_PAPER)
    np.testing.assert_allclose(wts, [0.8, 0.2])


def test_limit_measure_k2_circle_and_kd_identity():
    B, V = np.eye(3), np.diag([1.0, 1.0, -1.0])  # E = span(e1, e2)
    x = np.array([[0.6, 0.0, 0.8], [0.3, 0.0, -0.4 * np.sqrt(5.25)], [0.0, 0.6, 0.8]])
    x /= np.linalg.norm(x, axis=1)[:, None]
    pts, wts = limit_measure(x, [0.2, 0.3, 0.5], B, V)
    # first two points project to e1 and merge
    order = np.argsort(-pts[:, 0])
    np.testing.assert_allclose(pts[order], [[1.0, 0, 0], [0, 1.0, 0]], atol=1e-15)
    np.testing.assert_allclose(wts[order], [0.5, 0.5])
    with pytest.raises(ValueError, match="lies on E\\^perp"):
        limit_measure([[0.0, 0.0, 1.0]], [1.0], B, V)
    y = sample_uniform(50, 3, 1)
    pts, wts = limit_measure(y, np.full(50, 0.02), np.eye(3), np.eye(3))  # k = d: identity
    order = np.lexsort(pts.T)
    np.testing.assert_allclose(pts[order], y[np.lexsort(y.T)], atol=1e-15)
    np.testing.assert_allclose(wts, 0.02)


def test_lyapunov_vp_values_and_infinite_case():
    E = np.array([[1.0, 0.0, 0.0]])
    x = np.array([[0.6, 0.8, 0.0], [1.0, 0.0, 0.0]])
    # |(I-P)x|^2/|Px|^2 = 0.64/0.36 for the first point, 0 for the second
    assert lyapunov_vp(x, [0.5, 0.5], E, 0.25) == pytest.approx(0.5 * (0.64 / 0.36) ** 0.25)
    with pytest.raises(ValueError, match=r"V_p is infinite for a bounded density when 2p >= dim E: p = 0.5, "
                                         r"dim E = 1 \(allowed: p < 0.5\)"):
        lyapunov_vp(x, [0.5, 0.5], E, 0.5)
    assert lyapunov_vp(x, [0.5, 0.5], E, 0.5, strict=False) == pytest.approx(0.5 * 0.8 / 0.6)
    assert lyapunov_vp([[0.0, 1.0, 0.0]], [1.0], E, 0.25) == np.inf
    with pytest.raises(ValueError, match="p must be <= 1"):
        lyapunov_vp(x, [0.5, 0.5], np.eye(3)[:2], 1.5)


def test_lyapunov_vp_uniform_closed_form():
    # uniform on S^2, k = 1: |P_E x| = |z| with z uniform on [-1, 1], so V_p = int_0^1 ((1-z^2)/z^2)^p dz
    from scipy.integrate import quad

    p = 0.2
    exact = quad(lambda z: ((1 - z * z) / (z * z)) ** p, 0, 1)[0]
    x = sample_uniform(200000, 3, 0)
    est = lyapunov_vp(x, np.full(len(x), 1 / len(x)), [1.0, 0.0, 0.0], p)
    # Monte Carlo with a finite-variance integrand (4p < 1): ~3 standard errors (sd ~ 0.6, n = 2e5)
    assert est == pytest.approx(exact, abs=5e-3)


# ------------------------------------------------------------------ V_p of a grid density (grid path)
def _vp_uniform_exact(p):
    # uniform on S^2, k = 1: u = <e, x> uniform on [-1, 1] (Archimedes), so
    # V_p = int_0^1 ((1 - u^2)/u^2)^p du = B(1/2 - p, 1 + p) / 2 (substitute v = u^2): 1.8541 at p = 0.25,
    # 9.7288 at p = 0.45 (the weight |u|^{-2p} alone would give 1/(1 - 2p): V_p has the extra (1 - u^2)^p)
    from scipy.special import beta

    return 0.5 * beta(0.5 - p, 1.0 + p)


@pytest.mark.parametrize("p", [0.25, 0.45])
def test_lyapunov_vp_grid_uniform_exact_at_every_nside(p):
    """The paper's E = span(e1): HEALPix has pixel centres on E^perp (x1 = 6e-17), where the atom sum
    over centres blows up; the grid path integrates the weight over each cell and is exact for the
    uniform density (measured error <= 1e-14 relative at nside 1 to 8; 1e-12 allows for round-off in
    the N edge integrals)."""
    from spherepde import HealpixGrid

    E = spectral_data(B_PAPER, V_PAPER).E
    exact = _vp_uniform_exact(p)
    for nside in (1, 2, 3, 4, 8):
        g = HealpixGrid(nside)
        w = np.full(g.n_cells, 1.0 / g.n_cells)
        vp = lyapunov_vp(g.centers, w, E, p, grid=g)
        assert np.isfinite(vp) and abs(vp / exact - 1) < 1e-12, (nside, vp, exact)
        assert lyapunov_vp(g, w, E, p) == vp  # a grid passed as ``points``: same path
    assert lyapunov_vp(g.centers, w, E, p) > 1e3 * exact  # the centre sum: a centre on E^perp dominates


@pytest.mark.parametrize("nside", [3, 4])
def test_vp_cell_averages_exact_per_cell_in_the_equatorial_belt(nside):
    """E = span(e3), singular on the equator. In the HEALPix equatorial belt a pixel is a diamond in the
    Archimedes coordinates (z, phi) (z linear in x + y, phi in x - y, dA = dz dphi), so
    int_C w_p dA = int w_p(z) width(z) dz with a tent-shaped width: a 1-d integral that scipy's quad
    does to ~1e-14 with the algebraic weight |z|^{-2p} at z = 0 (split there). The cells crossing and
    touching the equator are the hard ones; measured agreement 1e-14, asserted 1e-10."""
    from scipy.integrate import quad

    from spherepde import HealpixGrid
    from spherepde.spectral import vp_cell_averages

    g = HealpixGrid(nside)
    h = 1.0 / nside
    for p in (0.25, 0.45):
        avg = vp_cell_averages(g, [[0.0, 0.0, 1.0]], p)
        cells = np.flatnonzero(np.abs(g.centers[:, 2]) < 0.35)
        assert len(cells) >= 4 * nside
        for i in cells:
            jr = np.array([2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4])[g._face[i]] - (g._ix[i] + g._iy[i]) * h
            zb, zt = (2 - jr) * 2 / 3, (2 - jr + 2 * h) * 2 / 3  # bottom and top corners
            zm = 0.5 * (zb + zt)
            width = lambda z: 0.5 * np.pi * h * (1 - abs(z - zm) / (zm - zb))  # phi-width at height z
            smooth = lambda z: (1 - z * z) ** p * width(z)  # w_p(z) = |z|^{-2p} (1 - z^2)^p
            zb, zm, zt = (0.0 if abs(z) < 1e-14 else z for z in (zb, zm, zt))  # corners on the equator
            pts = sorted({zb, zm, zt, 0.0} if zb < 0 < zt else {zb, zm, zt})
            ref = 0.0
            for a, b in zip(pts[:-1], pts[1:]):
                if a == 0.0 or b == 0.0:  # |z|^{-2p} as quad's algebraic end-point weight
                    wv = (-2 * p, 0) if a == 0.0 else (0, -2 * p)
                    ref += quad(smooth, a, b, weight="alg", wvar=wv, epsabs=0, epsrel=1e-13)[0]
                else:
                    ref += quad(lambda z: smooth(z) * abs(z) ** (-2 * p), a, b, epsabs=0, epsrel=1e-13)[0]
            assert abs(avg[i] * g.areas[i] / ref - 1) < 1e-10, (i, avg[i] * g.areas[i], ref)


def test_vp_cell_averages_tensor_grid_closed_form_and_generic_E():
    """TensorGrid(3): cells are (psi, phi) boxes, so with E = span(e3) (k = 1) or E = span(e1, e2) (k = 2)
    int_C w_p dA = dphi (H(cos psi0) - H(cos psi1)) with the closed-form antiderivative H (incomplete
    beta) of w_p as a function of z, for every cell, including those with the equator as an edge (n
    even) or crossing it (n odd). Measured <= 3e-13 relative; asserted 1e-11. Then a tilted E on HEALPix:
    cells away from E^perp and from +-e against a high-order cell quadrature of the (there smooth) weight
    (measured 2e-15; asserted 1e-10)."""
    from spherepde import HealpixGrid, TensorGrid
    from spherepde.spectral import _vp_profile, vp_cell_averages

    for n in (7, 8):
        g = TensorGrid(3, n)
        z0, z1 = np.cos(g.lo[:, 0]), np.cos(g.hi[:, 0])
        z0, z1 = (np.where(np.abs(z) < 1e-14, 0.0, z) for z in (z0, z1))  # cos(pi/2) = 6e-17 is 0
        for E, k, p in (([[0.0, 0.0, 1.0]], 1, 0.45), ([[0.0, 0.0, 1.0]], 1, 0.25), (np.eye(3)[:2], 2, 0.75)):
            H = _vp_profile(k, p)
            ref = (g.hi[:, 1] - g.lo[:, 1]) * (H(z0, 0.0 * z0) - H(z1, 0.0 * z1)) / g.areas
            np.testing.assert_allclose(vp_cell_averages(g, E, p), ref, rtol=1e-11, atol=0)
    g = HealpixGrid(8)
    e = np.array([0.6, 0.0, 0.8])
    avg = vp_cell_averages(g, [e], 0.45)
    far = (np.abs(g.centers @ e) > 0.4) & (np.abs(g.centers @ e) < 0.95)  # w_p ~ dist^{2p} at +-e: a cusp
    ref = g.cell_average(lambda x: ((1 - (x @ e) ** 2) / (x @ e) ** 2) ** 0.45, order=24)
    np.testing.assert_allclose(avg[far], ref[far], rtol=1e-10)


def test_lyapunov_vp_grid_strict_and_infinite():
    from spherepde import HealpixGrid

    g = HealpixGrid(2)
    w = np.full(g.n_cells, 1.0 / g.n_cells)
    with pytest.raises(ValueError, match="V_p is infinite"):
        lyapunov_vp(g.centers, w, [[1.0, 0.0, 0.0]], 0.5, grid=g)
    assert lyapunov_vp(g.centers, w, [[1.0, 0.0, 0.0]], 0.5, strict=False, grid=g) == np.inf
    # no mass in the cells that meet E^perp: finite (the weight is bounded elsewhere)
    w2 = np.where(np.abs(g.centers[:, 0]) > 0.6, w, 0.0)
    assert np.isfinite(lyapunov_vp(g.centers, w2, [[1.0, 0.0, 0.0]], 0.5, strict=False, grid=g))
    with pytest.raises(ValueError, match="weights must have shape"):
        lyapunov_vp(g.centers, w[:-1], [[1.0, 0.0, 0.0]], 0.25, grid=g)


@pytest.mark.parametrize("d,k,p", [(2, 1, 0.45), (3, 1, 0.25), (3, 1, 0.45), (3, 2, 0.7), (4, 3, 1.0), (5, 2, 0.3)])
def test_lyapunov_vp_uniform_against_quadrature(d, k, p):
    """The closed form B(k/2 - p, (d-k)/2 + p)/B(k/2, (d-k)/2) against an independent route: adaptive
    quadrature of ((1 - r)/r)^p against the Beta(k/2, (d-k)/2) density of r = |P_E x|^2 (substituting
    r = s^2 to soften the endpoint singularity). quad reaches ~1e-10 relative on these integrands."""
    from scipy import integrate, stats

    from spherepde import lyapunov_vp_uniform

    dens = stats.beta(k / 2, (d - k) / 2)
    val, _ = integrate.quad(lambda s: ((1 - s * s) / (s * s)) ** p * dens.pdf(s * s) * 2 * s, 0, 1, limit=400)
    assert abs(lyapunov_vp_uniform(d, k, p) - val) < 1e-8 * val


def test_lyapunov_vp_uniform_closed_forms_and_errors():
    from spherepde import HealpixGrid, lyapunov_vp_uniform

    assert abs(lyapunov_vp_uniform(2, 1, 0.3) - 1 / np.cos(0.3 * np.pi)) < 1e-13
    assert lyapunov_vp_uniform(3, 3, 0.5) == 0.0
    # the grid path for the uniform density on HEALPix equals it (exact cell integrals)
    g = HealpixGrid(4)
    E = np.array([[1.0, 0.0, 0.0]])
    assert abs(lyapunov_vp(g.centers, g.areas / g.total_area, E, 0.25, grid=g)
               - lyapunov_vp_uniform(3, 1, 0.25)) < 1e-12
    with pytest.raises(ValueError, match="p < 0.5"):
        lyapunov_vp_uniform(3, 1, 0.5)
    with pytest.raises(ValueError, match="k"):
        lyapunov_vp_uniform(3, 4, 0.2)


@pytest.mark.parametrize("p", [0.25, 0.45])
def test_vp_grid_path_on_adaptive_cells(p):
    """The grid path of V_p on an adaptive HEALPix grid (each cell its own square of the face lattice):
    a uniform adaptive grid gives HealpixGrid's cell averages (NESTED order; the same edges), and a grid
    of three orders with pixel centres on E^perp is exact for the uniform density (the edge integrals
    of every cell, at its own size: 1e-12 as for the uniform grid above)."""
    import healpy as hp

    from spherepde import HealpixGrid
    from spherepde.grids.adaptive import AdaptiveHealpixGrid
    from spherepde.spectral import vp_cell_averages

    E = spectral_data(B_PAPER, V_PAPER).E
    a, h = AdaptiveHealpixGrid(4, 4), HealpixGrid(4)
    perm = hp.nest2ring(4, a.ipix)
    assert np.abs(vp_cell_averages(a, E, p) / vp_cell_averages(h, E, p)[perm] - 1).max() < 1e-13
    g = AdaptiveHealpixGrid(2, 8, refinement=False).refined_where(lambda gr: np.abs(gr.centers[:, 0]) < 0.3)
    assert set(np.unique(g.order)) == {1, 2, 3}
    w = g.areas / g.areas.sum()
    vp = lyapunov_vp(g.centers, w, E, p, grid=g)
    assert abs(vp / _vp_uniform_exact(p) - 1) < 1e-12


def test_vp_adaptive_cells_integrated_once_across_grids(monkeypatch):
    """An adaptive run's saved states share most of their cells: V_p's cell averages are stored by NUNIQ and
    each cell is integrated once (a regridded tiling integrates only the cells it made), with the same bits
    as integrating the whole tiling at once, whatever was asked before (the edge quadrature sums element by
    element, so a cell's value does not depend on the batch it was integrated in)."""
    from spherepde import spectral
    from spherepde.grids.adaptive import AdaptiveHealpixGrid

    E = spectral_data(B_PAPER, V_PAPER).E
    a = spectral.as_basis(E, 3)[0]
    H = spectral._vp_profile(1, 0.25)
    g1 = AdaptiveHealpixGrid(4, 32, refinement=False).refined_where(lambda gr: np.abs(gr.centers[:, 0]) < 0.2)
    g2 = g1.adapt(refine=np.abs(g1.centers[:, 2] - 0.5) < 0.15)  # a second tiling sharing most cells
    kept = g2.kept_cells(g1)
    assert 0 < (~kept).sum() < 0.5 * g2.n_cells
    whole = [spectral._axial_cell_integrals(g, a, H)[0] / g.areas for g in (g1, g2)]  # the direct path
    monkeypatch.setattr(spectral, "_VP_CELLS", spectral.collections.OrderedDict())
    counted = []
    real = spectral._axial_cell_integrals
    monkeypatch.setattr(spectral, "_axial_cell_integrals",
                        lambda grid, *args: (counted.append(grid.n_cells), real(grid, *args))[1])
    v2 = spectral.vp_cell_averages(g2, E, 0.25)  # g2 first: g1's average then needs g1's coarse cells only
    v1 = spectral.vp_cell_averages(g1, E, 0.25)
    assert counted == [g2.n_cells, int((~g1.kept_cells(g2)).sum())]
    assert np.array_equal(v1, whole[0]) and np.array_equal(v2, whole[1])
    g3 = AdaptiveHealpixGrid(4, 32, g2.uniq[::-1].copy(), refinement=False)  # a new grid of the same cells
    assert g3 is not g2 and len(counted) == 2
    v3 = spectral.vp_cell_averages(g3, E, 0.25)
    pos = np.searchsorted(np.sort(g2.uniq), g3.uniq)
    assert np.array_equal(v3, whole[1][np.argsort(g2.uniq)][pos]) and len(counted) == 2  # nothing integrated again
