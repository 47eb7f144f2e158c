"""Sampling: goodness of fit at fixed seeds (each test's statistic would reject a wrong sampler)."""
import numpy as np
import pytest
from scipy import stats

from spherepde.sampling import (
    sample_grid_density,
    sample_uniform,
    sample_vmf,
    sample_vmf_mixture,
    vmf_mean_resultant,
)


class BandGrid:
    """Tiny fake grid on S^2 (not the package's grids): cells are latitude bands of equal polar-angle
    width, so their areas differ (2 pi (z_hi - z_lo)). A uniform point in a band: z uniform in
    [z_lo, z_hi] (Archimedes), longitude uniform."""

    def __init__(self, nbands=12):
        theta = np.linspace(0.0, np.pi, nbands + 1)
        self.z_hi = np.cos(theta[:-1])
        self.z_lo = np.cos(theta[1:])
        self.areas = 2 * np.pi * (self.z_hi - self.z_lo)
        zc = 0.5 * (self.z_hi + self.z_lo)
        self.centers = np.stack([np.sqrt(1 - zc**2), 0 * zc, zc], axis=1)

    def sample_in_cells(self, cells, rng):
        z = rng.uniform(self.z_lo[cells], self.z_hi[cells])
        phi = rng.uniform(0, 2 * np.pi, size=len(cells))
        r = np.sqrt(1 - z**2)
        return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)

    def cell_of(self, x):
        return np.clip(np.searchsorted(-self.z_hi, -x[:, 2], side="right") - 1, 0, len(self.areas) - 1)


def test_grid_density_chi_square():
    grid = BandGrid(12)
    zc = grid.centers[:, 2]
    f = 1.0 + 3.0 * zc**2 + zc  # not symmetric, not proportional to area
    n = 20000
    x = sample_grid_density(grid, f, n, rng=123)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-14)
    counts = np.bincount(grid.cell_of(x), minlength=12)
    expected = n * f * grid.areas / np.sum(f * grid.areas)
    # choosing cells by f alone (forgetting areas) gives chi2 ~ 1e3 here: rejected at any level
    p = stats.chisquare(counts, expected).pvalue
    assert p > 1e-3, p


def test_grid_density_seed_and_errors():
    grid = BandGrid(6)
    f = np.ones(6)
    a = sample_grid_density(grid, f, 50, rng=7)
    b = sample_grid_density(grid, f, 50, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="f must have one value per cell"):
        sample_grid_density(grid, np.ones(5), 10)
    with pytest.raises(ValueError, match="f must be finite and >= 0"):
        sample_grid_density(grid, -f, 10)
    with pytest.raises(ValueError, match="positive total mass"):
        sample_grid_density(grid, 0 * f, 10)
    with pytest.raises(TypeError, match="rng must be"):
        sample_uniform(3, 3, rng="seed")


@pytest.mark.parametrize("d", [2, 3, 5])
def test_uniform_marginal(d):
    x = sample_uniform(20000, d, rng=d)
    # <x, e> for uniform x on S^(d-1): (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2)
    t = (1 + x[:, 0]) / 2
    p = stats.kstest(t, stats.beta((d - 1) / 2, (d - 1) / 2).cdf).pvalue
    assert p > 1e-3, p


@pytest.mark.parametrize("kappa", [0.5, 10.0, 1000.0])
def test_vmf_s2_cosine_law(kappa):
    # on S^2 the cosine w = <x, mu> has density kappa e^{kappa w} / (2 sinh kappa) on [-1, 1]
    mu = np.array([1.0, 2.0, -2.0]) / 3.0
    x = sample_vmf(20000, mu, kappa, rng=11)
    w = x @ mu
    def cdf(s):
        # P(w <= s) = (e^{kappa s} - e^{-kappa}) / (e^kappa - e^-kappa), scaled by e^{-kappa}: no overflow
        return (np.exp(kappa * (s - 1)) - np.exp(-2 * kappa)) / -np.expm1(-2 * kappa)

    p = stats.kstest(w, cdf).pvalue
    assert p > 1e-3, p
    # the component orthogonal to mu is isotropic: mean ~ 0
    perp = x - np.outer(w, mu)
    assert np.linalg.norm(perp.mean(axis=0)) < 5 * np.sqrt(np.mean(1 - w**2) / 20000)


@pytest.mark.parametrize("d", [3, 4, 7])
@pytest.mark.parametrize("kappa", [0.0, 2.0, 50.0])
def test_vmf_mean_resultant_length(d, kappa):
    rng = np.random.default_rng(100 * d + int(kappa))
    mu = rng.standard_normal(d)
    mu /= np.linalg.norm(mu)
    n = 40000
    w = sample_vmf(n, mu, kappa, rng) @ mu
    # sample mean of w vs A_d(kappa): 5 standard errors (a sampler with the wrong d in Wood's proposal is
    # off by > 10 standard errors at these n)
    assert abs(w.mean() - vmf_mean_resultant(kappa, d)) < 5 * w.std() / np.sqrt(n) + 1e-12


def test_vmf_mean_resultant_closed_forms():
    k = np.array([0.1, 1.0, 10.0, 700.0, 5000.0])
    np.testing.assert_allclose(vmf_mean_resultant(k, 3), 1 / np.tanh(k) - 1 / k, rtol=1e-12)
    assert vmf_mean_resultant(0.0, 3) == 0.0


def test_vmf_mixture_weights_and_components():
    means = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
    weights = np.array([0.5, 0.3, 0.2])
    n = 20000
    x = sample_vmf_mixture(n, means, [200.0, 200.0, 200.0], weights, rng=5)
    # kappa = 200: every point within ~0.3 rad of its mean, so the label is the nearest mean
    lab = np.argmax(x @ means.T, axis=1)
    counts = np.bincount(lab, minlength=3)
    p = stats.chisquare(counts, n * weights).pvalue
    assert p > 1e-3, p
    with pytest.raises(ValueError, match="kappas must have shape"):
        sample_vmf_mixture(10, means, [1.0, 2.0])
    with pytest.raises(ValueError, match="kappa must be >= 0"):
        sample_vmf(10, [1.0, 0, 0], -1.0)
