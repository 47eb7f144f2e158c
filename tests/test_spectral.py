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
