"""Seeded iid sampling of tokens on S^(d-1): uniform, von Mises-Fisher mixtures, grid densities.

Functions
---------
sample_uniform(n, d=3, rng=None)
    n iid uniform points on S^(d-1).
sample_vmf(n, mean, kappa, rng=None)
    n iid points from the von Mises-Fisher law vMF(mean, kappa), exact (Wood's algorithm), any d.
sample_vmf_mixture(n, means, kappas, weights=None, rng=None)
    n iid points from a finite mixture of vMF laws.
sample_grid_density(grid, f, n, rng=None)
    n iid points from a piecewise-constant grid density: a cell by its mass f * area, then a uniform
    point in that cell (``grid.sample_in_cells(cells, rng)``).
vmf_mean_resultant(kappa, d)
    A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa) = E <x, mean> under vMF(mean, kappa).

Every function takes ``rng`` as ``None``, an int seed or a ``numpy.random.Generator``.

On S^2 (d = 3) :func:`sample_vmf` draws with ``scipy.stats.vonmises_fisher`` (SciPy >= 1.11: the exact
inverse CDF of the cosine, 2-4x faster than our Wood rejection: median of 5 runs for n = 2e5, 18-26 ms
against 35-130 ms, kappa 1e-3 to 1e10). For d != 3 we keep our Wood sampler: SciPy's is only 1.2-2x
faster there and biased at large kappa (mean resultant length off by 10.8 and 7.0 standard errors for
d = 4, 5 at kappa = 1e8, n = 2e5; ours within 1.2), and it keeps the direct path beyond ``LARGE_KAPPA``.
"""
from __future__ import annotations

import numpy as np
from scipy.special import ive

from ._checks import finite_float, positive_int

__all__ = [
    "as_generator",
    "sample_uniform",
    "sample_vmf",
    "sample_vmf_mixture",
    "sample_grid_density",
    "vmf_mean_resultant",
]


def as_generator(rng) -> np.random.Generator:
    """``None`` / int seed / Generator -> ``numpy.random.Generator``."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be None, an int seed or a numpy.random.Generator, got {rng!r}")


def sample_uniform(n: int, d: int = 3, rng=None) -> np.ndarray:
    """n iid uniform points on S^(d-1).

    Returns
    -------
    (n, d) ndarray of unit rows (normalised standard Gaussian vectors).
    """
    n = positive_int(n, "n", minimum=0)
    d = positive_int(d, "d", minimum=2)
    g = as_generator(rng)
    x = g.standard_normal((n, d))
    nrm = np.linalg.norm(x, axis=1)
    while np.any(nrm == 0):  # probability zero, but keep the output on the sphere
        bad = nrm == 0
        x[bad] = g.standard_normal((int(bad.sum()), d))
        nrm = np.linalg.norm(x, axis=1)
    return x / nrm[:, None]


def vmf_mean_resultant(kappa, d: int):
    """A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa): the mean of <x, mu> under vMF(mu, kappa) on S^(d-1).

    Uses exponentially scaled Bessel functions (no overflow); A_d(0) = 0.
    """
    k = np.asarray(kappa, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = ive(d / 2.0, k) / ive(d / 2.0 - 1.0, k)
    return np.where(k == 0, 0.0, r)


#: Beyond this concentration :func:`_wood_cosines` samples the cosine directly (see there).
LARGE_KAPPA = 1e8


def _wood_cosines(n: int, kappa: float, d: int, g: np.random.Generator) -> np.ndarray:
    """n iid samples of w = <x, mu> under vMF(mu, kappa) on S^(d-1), by Wood's rejection (exact)."""
    if kappa == 0.0:
        # the marginal of a uniform point: w = 2 Z - 1, Z ~ Beta((d-1)/2, (d-1)/2)
        return 2.0 * g.beta((d - 1) / 2.0, (d - 1) / 2.0, size=n) - 1.0
    if kappa >= LARGE_KAPPA:
        # Wood's constants lose every digit here (x0 rounds to 1; kappa**2 overflows near 1e154). On S^2
        # the inverse CDF is exact and stable: w = 1 + log(u + (1 - u) e^(-2 kappa)) / kappa. For d != 3,
        # 1 - w ~ Gamma((d - 1) / 2, 1 / kappa), the law's limit, off by O(1 / kappa) <= 1e-8 relative.
        u = g.random(n)
        if d == 3:
            return np.clip(1.0 + np.log(u + (1.0 - u) * np.exp(-2.0 * kappa)) / kappa, -1.0, 1.0)
        return np.clip(1.0 - g.gamma((d - 1) / 2.0, 1.0, size=n) / kappa, -1.0, 1.0)
    m = d - 1.0
    # b = (-2k + sqrt(4k^2 + m^2)) / m, written without cancellation for large kappa
    b = m / (2.0 * kappa + np.sqrt(4.0 * kappa**2 + m**2))
    x0 = (1.0 - b) / (1.0 + b)
    c = kappa * x0 + m * np.log1p(-x0 * x0)
    out = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        z = g.beta(m / 2.0, m / 2.0, size=todo.size)
        w = (1.0 - (1.0 + b) * z) / (1.0 - (1.0 - b) * z)
        u = g.random(todo.size)
        ok = kappa * w + m * np.log1p(-x0 * w) - c >= np.log(u)
        out[todo[ok]] = w[ok]
        todo = todo[~ok]
    return np.clip(out, -1.0, 1.0)


def sample_vmf(n: int, mean, kappa: float, rng=None) -> np.ndarray:
    r"""n iid points from the von Mises-Fisher law on S^(d-1), density proportional to exp(kappa <mu, x>).

    Parameters
    ----------
    n : int
    mean : (d,) array_like
        Mean direction mu (normalised here; must be nonzero).
    kappa : float
        Concentration, >= 0 (0 is uniform).
    rng : None, int or Generator

    Returns
    -------
    (n, d) ndarray of unit rows.

    Notes
    -----
    d = 3: ``scipy.stats.vonmises_fisher`` (exact inverse CDF; see the module docstring for why only
    there). Otherwise Wood (1994): w = <x, mu> by rejection from a Beta proposal (exact), then
    x = w mu + sqrt(1 - w^2) v with v uniform on the unit sphere of mu^perp.

    References
    ----------
    A. T. A. Wood, "Simulation of the von Mises Fisher distribution", Comm. Statist. Simulation Comput.
    23 (1994) 157-164, doi:10.1080/03610919408813161.
    """
    n = positive_int(n, "n", minimum=0)
    mu = np.array(mean, dtype=float)
    if mu.ndim != 1 or mu.size < 2 or not np.all(np.isfinite(mu)) or np.linalg.norm(mu) == 0:
        raise ValueError(f"mean must be a finite nonzero vector of length d >= 2, got {mean!r}")
    mu = mu / np.linalg.norm(mu)
    kappa = finite_float(kappa, "kappa", low=0.0)
    d = mu.size
    g = as_generator(rng)
    if d == 3 and kappa > 0 and n > 0:
        from scipy.stats import vonmises_fisher

        x = np.asarray(vonmises_fisher(mu, kappa).rvs(n, random_state=g), dtype=float).reshape(n, d)
        return x / np.linalg.norm(x, axis=1)[:, None]
    w = _wood_cosines(n, kappa, d, g)
    v = g.standard_normal((n, d))
    v -= (v @ mu)[:, None] * mu
    nv = np.linalg.norm(v, axis=1)
    nv[nv == 0] = 1.0
    v /= nv[:, None]
    x = w[:, None] * mu + np.sqrt(np.maximum(0.0, 1.0 - w * w))[:, None] * v
    return x / np.linalg.norm(x, axis=1)[:, None]


def sample_vmf_mixture(n: int, means, kappas, weights=None, rng=None) -> np.ndarray:
    """n iid points from sum_c weights_c vMF(means_c, kappas_c) on S^(d-1).

    Parameters
    ----------
    n : int
    means : (c, d) array_like
        Mean directions (rows, normalised here).
    kappas : (c,) array_like or float
        Concentrations >= 0.
    weights : (c,) array_like, optional
        Mixture weights >= 0 (normalised); default equal.
    rng : None, int or Generator

    Returns
    -------
    (n, d) ndarray of unit rows, in random order (component labels are drawn iid).
    """
    n = positive_int(n, "n", minimum=0)
    mus = np.atleast_2d(np.array(means, dtype=float))
    c = mus.shape[0]
    ks = np.broadcast_to(np.array(kappas, dtype=float), (c,)) if np.ndim(kappas) == 0 else np.array(kappas, float)
    if ks.shape != (c,):
        raise ValueError(f"kappas must have shape ({c},) (one per mean), got {ks.shape}")
    if weights is None:
        p = np.full(c, 1.0 / c)
    else:
        p = np.array(weights, dtype=float)
        if p.shape != (c,) or not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
            raise ValueError(f"weights must be {c} finite non-negative numbers with positive sum, got {weights!r}")
        p = p / p.sum()
    g = as_generator(rng)
    labels = g.choice(c, size=n, p=p)
    x = np.empty((n, mus.shape[1]))
    for j in range(c):
        idx = np.flatnonzero(labels == j)
        x[idx] = sample_vmf(idx.size, mus[j], ks[j], g)
    return x


def sample_grid_density(grid, f, n: int, rng=None) -> np.ndarray:
    """n iid points from the piecewise-constant density ``f`` on ``grid``.

    Parameters
    ----------
    grid : grid object
        Needs ``areas`` (n_cells,) and ``sample_in_cells(cells, rng) -> (len(cells), d)``, a uniform
        point (w.r.t. surface measure) in each listed cell.
    f : (n_cells,) array_like
        Density values per cell (w.r.t. surface measure), >= 0, not all zero; need not integrate to 1.
    n : int
    rng : None, int or Generator

    Returns
    -------
    (n, d) ndarray of unit rows.

    Notes
    -----
    Exact for the piecewise-constant density: the cell is drawn with probability
    f_c |c| / sum_c' f_c' |c'|, then the point uniformly in the cell.
    """
    n = positive_int(n, "n", minimum=0)
    areas = np.asarray(grid.areas, dtype=float)
    f = np.asarray(f, dtype=float)
    if f.shape != areas.shape:
        raise ValueError(f"f must have one value per cell, shape {areas.shape}, got {f.shape}")
    if not np.all(np.isfinite(f)) or np.any(f < 0):
        raise ValueError("f must be finite and >= 0 (a density)")
    mass = f * areas
    tot = mass.sum()
    if not tot > 0:
        raise ValueError("f must have positive total mass sum(f * areas)")
    g = as_generator(rng)
    cells = g.choice(mass.size, size=n, p=mass / tot)
    x = np.asarray(grid.sample_in_cells(cells, g), dtype=float)
    if x.shape[0] != n:
        raise ValueError(f"grid.sample_in_cells returned {x.shape[0]} points for {n} cells")
    return x
