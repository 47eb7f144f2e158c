"""W2 on the sphere against POT's exact ot.emd2 (with independently built cost matrices)."""
import numpy as np
import ot
import pytest

from spherepde.sampling import sample_uniform, sample_vmf_mixture
from spherepde.wasserstein import coarsen_measure, wasserstein2, wasserstein2_two_atoms


def ref_w2(xa, wa, xb, wb, cost):
    """Reference: POT's distance helper and emd2 on normalised weights."""
    if cost == "chordal":
        M = ot.dist(xa, xb, metric="sqeuclidean")
    else:
        M = np.arccos(np.clip(xa @ xb.T, -1, 1)) ** 2
    return np.sqrt(ot.emd2(wa / wa.sum(), wb / wb.sum(), M))


def test_two_diracs_explicit():
    x = np.array([[1.0, 0.0, 0.0]])
    y = np.array([[0.0, 1.0, 0.0]])
    assert wasserstein2(x, [1.0], y, [1.0]) == pytest.approx(np.sqrt(2.0), rel=1e-15)
    assert wasserstein2(x, [1.0], y, [1.0], cost="geodesic") == pytest.approx(np.pi / 2, rel=1e-15)
    # half of the mass moves by a right angle: W2^2 = 0.5 * 2
    xa = np.array([[1.0, 0, 0], [0, 0, 1.0]])
    xb = np.array([[1.0, 0, 0], [0, 1.0, 0]])
    assert wasserstein2(xa, [0.5, 0.5], xb, [0.5, 0.5]) == pytest.approx(1.0, rel=1e-14)


@pytest.mark.parametrize("cost", ["chordal", "geodesic"])
def test_matches_emd2_random(cost):
    rng = np.random.default_rng(0)
    xa, xb = sample_uniform(30, 3, rng), sample_uniform(41, 3, rng)
    wa, wb = rng.random(30), rng.random(41)
    wb *= wa.sum() / wb.sum()
    # same LP, same solver: agreement to rounding of the cost matrix
    assert wasserstein2(xa, wa, xb, wb, cost=cost) == pytest.approx(ref_w2(xa, wa, xb, wb, cost), rel=1e-10)


@pytest.mark.parametrize("cost", ["chordal", "geodesic"])
@pytest.mark.parametrize("atoms", ["antipodal", "generic", "one"])
def test_two_atom_fast_path_matches_emd2(cost, atoms):
    rng = np.random.default_rng(1)
    x = sample_vmf_mixture(300, [[1.0, 0, 0], [0, 1.0, 1.0]], [3.0, 8.0], rng=rng)
    w = rng.random(300)
    w /= w.sum()
    e = np.array([1.0, 0.0, 0.0])
    if atoms == "antipodal":
        z, m = np.stack([e, -e]), np.array([0.35, 0.65])
    elif atoms == "generic":
        z, m = np.array([[0.0, 0.6, 0.8], [0.0, 0.0, -1.0]]), np.array([0.8, 0.2])
    else:
        z, m = e[None, :], np.array([1.0])
    fast = wasserstein2_two_atoms(x, w, z, m, cost=cost)
    # the greedy fractional-knapsack plan is exactly optimal: agreement to LP rounding
    assert fast == pytest.approx(ref_w2(x, w, z, m, cost), rel=1e-10)
    assert wasserstein2(x, w, z, m, cost=cost) == fast  # dispatch, either order
    assert wasserstein2(z, m, x, w, cost=cost) == fast


def test_geodesic_chordal_ratio_and_zero_distance():
    rng = np.random.default_rng(2)
    xa, xb = sample_uniform(25, 3, rng), sample_uniform(25, 3, rng)
    w = np.full(25, 0.04)
    c, g = wasserstein2(xa, w, xb, w), wasserstein2(xa, w, xb, w, cost="geodesic")
    assert c <= g <= np.pi / 2 * c
    assert wasserstein2(xa, w, xa, w) == pytest.approx(0.0, abs=1e-7)


def test_mass_checks_and_errors():
    x = sample_uniform(5, 3, 3)
    with pytest.raises(ValueError, match="different total masses"):
        wasserstein2(x, np.ones(5), x, np.full(5, 0.5))
    # masses equal within mass_rtol are normalised
    assert wasserstein2(x, np.ones(5), x, np.ones(5) * (1 + 1e-9)) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="cost must be one of"):
        wasserstein2(x, np.ones(5), x, np.ones(5), cost="l1")
    with pytest.raises(ValueError, match="same dimension"):
        wasserstein2(x, np.ones(5), x[:, :2], np.ones(5))
    with pytest.raises(ValueError, match="exact W2 needs an n_a x n_b = 5 x 5 = 25 LP, above max_size"):
        wasserstein2(x, np.ones(5), x, np.ones(5), max_size=20)


@pytest.mark.parametrize("method", ["healpix", "kmeans"])
def test_coarsening_within_its_bound(method):
    rng = np.random.default_rng(4)
    xa = sample_vmf_mixture(600, [[0, 0, 1.0], [1.0, 0, 0]], [10.0, 4.0], rng=rng)
    xb = sample_uniform(500, 3, rng)
    wa, wb = np.full(600, 1 / 600), np.full(500, 1 / 500)
    exact = wasserstein2(xa, wa, xb, wb)
    max_size = 200 * 200
    approx = wasserstein2(xa, wa, xb, wb, max_size=max_size, coarsen=method)
    _, _, da = coarsen_measure(xa, wa, 200, method)
    _, _, db = coarsen_measure(xb, wb, 200, method)
    # triangle inequality: |W2(a', b') - W2(a, b)| <= W2(a, a') + W2(b, b') <= da + db
    assert abs(approx - exact) <= da + db + 1e-9
    assert da + db < 0.3  # and the bound is informative at this resolution
    c, m, _ = coarsen_measure(xa, wa, 200, method)
    assert c.shape[0] <= 200 and m.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0)
