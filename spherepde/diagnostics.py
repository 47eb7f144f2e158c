"""Diagnostics of a measure on S^(d-1) that the paper plots, for PDE and particle runs alike.

Functions
---------
alignment(points, weights, basis)
    int |P_S x|^2 d rho for the subspace S with orthonormal rows ``basis``.
interaction_energy(points, weights, B, beta, log=False)
    E_B(rho) = sum_ij w_i w_j exp(beta <x_i, B x_j>) (or its logarithm), without overflow.
concentration_diagnostics(points, weights, B, V, p=0.25, limit=None, ...)
    Dict of W2 to Pi#rho_0, alignment with E, F and F_abs, V_p, and the grid floor of W2.
w2_grid_floor(support, limit_points, limit_weights=None, cost="chordal")
    The least W2 from any measure on the points ``support`` (a grid's centres) to a discrete limit.

All take a discrete measure ``(points (n, d), weights (n,))``; a grid density enters as
``(grid.centers, f * grid.areas)`` (or with the grid itself in place of its centres). Conventions:
score <x, B y>, value V y, A = V B^T.
"""
from __future__ import annotations

import functools
import logging
import warnings

import numpy as np
from scipy.special import logsumexp

from ._checks import finite_float, real_array
from .kernels.particles import launch, softmax_mean
from .spectral import SpectralData, as_basis, limit_measure, lyapunov_vp, spectral_data
from .wasserstein import cost_matrix, wasserstein2

__all__ = ["alignment", "interaction_energy", "concentration_diagnostics", "transition_time", "exit_time",
           "w2_grid_floor", "W2_FLOOR_FACTOR"]

#: ``w2_at_floor`` is set when W2 <= this factor times the grid floor: the distance is then set by where
#: the cell centres lie (a plateau of W2 against t at grid resolution), not by the density.
W2_FLOOR_FACTOR = 1.5

logger = logging.getLogger(__name__)


def _measure(points, weights):
    x = np.ascontiguousarray(np.atleast_2d(real_array(points, "points")))
    w = real_array(weights, "weights").reshape(-1)
    if x.ndim != 2 or w.shape != (x.shape[0],):
        raise ValueError(f"points (n, d) and weights (n,) must match, got {np.shape(points)} and "
                         f"{np.shape(weights)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(w))) or np.any(w < 0):
        raise ValueError("points must be finite and weights finite and >= 0")
    return x, w


def alignment(points, weights, basis) -> float:
    r"""Alignment int |P_S x|^2 d rho(x) with the subspace S spanned by the orthonormal rows of ``basis``.

    Parameters
    ----------
    points : (n, d) array_like
    weights : (n,) array_like
        Masses (used as given: for a probability measure the result lies in [0, 1], and equals 1 iff
        rho is supported on S).
    basis : (k, d) array_like
        Orthonormal rows (a (d,) vector is k = 1).

    Returns
    -------
    float
    """
    x, w = _measure(points, weights)
    b = as_basis(basis, x.shape[1], "basis")
    c = x @ b.T
    return float(np.dot(w, np.einsum("ij,ij->i", c, c)))


def interaction_energy(points, weights, B, beta: float, log: bool = False) -> float:
    r"""Interaction energy E_B(rho) = int int exp(beta <x, B y>) d rho(x) d rho(y) of a discrete measure.

    Parameters
    ----------
    points : (n, d) array_like
    weights : (n,) array_like
        Masses >= 0.
    B : (d, d) array_like
        Score matrix (score <x, B y>).
    beta : float
        Inverse temperature, finite and >= 0.
    log : bool, default False
        Return log E_B (finite for any beta) instead of E_B (beyond ~exp(709), E_B is an OverflowError that
        says so).

    Returns
    -------
    float

    Notes
    -----
    log E_B = logsumexp_i( log w_i + log sum_j w_j exp(beta <x_i, B x_j>) ), the inner sums by the
    shifted row log-sum-exp of the particle kernel: O(n^2 d), no n x n array, no overflow.
    """
    x, w = _measure(points, weights)
    d = x.shape[1]
    Bm = np.ascontiguousarray(np.asarray(B, dtype=float))
    if Bm.shape != (d, d) or not np.all(np.isfinite(Bm)):
        raise ValueError(f"B must be a finite {d} x {d} matrix, got shape {Bm.shape}")
    beta = finite_float(beta, "beta", low=0.0)
    if not w.sum() > 0:
        raise ValueError("weights must have positive total mass")
    keep = w > 0
    x, w = np.ascontiguousarray(x[keep]), w[keep]
    logw = np.log(w)
    mean = np.empty_like(x)
    lse = np.empty(x.shape[0])
    launch(softmax_mean, x.shape[0] ** 2, x, np.ascontiguousarray(x.T), logw, Bm, beta, mean, lse)
    logE = float(logsumexp(logw + lse))
    if log:
        return logE
    if logE > 709.0:  # not inf as if it were a value: say what to do
        raise OverflowError(f"E_B = exp({logE:.6g}) overflows a float at beta = {beta:g}: use log=True for log E_B")
    return float(np.exp(logE))


@functools.lru_cache(maxsize=2)
def _healpix(nside: int):
    from .grids.healpix import HealpixGrid

    return HealpixGrid(nside)


def _healpix_of(x: np.ndarray):
    """The HEALPix grid whose centres (RING order) ``x`` are, else None (a grid density passed as
    ``(grid.centers, f * grid.areas)``, the documented form)."""
    n, d = x.shape
    ns = int(round(np.sqrt(n / 12.0)))
    if d != 3 or ns < 1 or 12 * ns * ns != n:
        return None
    import healpy as hp

    c = np.array(hp.pix2vec(ns, np.arange(n))).T
    return _healpix(ns) if np.max(np.abs(c - x)) <= 1e-12 else None


def w2_grid_floor(support, limit_points, limit_weights=None, cost: str = "chordal") -> float:
    r"""The least W2 from any probability measure on the points ``support`` to the limit measure.

    Parameters
    ----------
    support : Grid or (n, d) array_like
        Where the measure may put mass (a grid density lives on ``grid.centers``).
    limit_points : (m, d) array_like
        Atoms of the limit measure (e.g. Pi#rho_0 from ``limit_measure``).
    limit_weights : (m,) array_like, optional
        Their masses (normalised here; default equal).
    cost : {"chordal", "geodesic"}

    Returns
    -------
    float
        sqrt(sum_j a_j min_c |c - p_j|^2): every atom p_j must receive its mass a_j from points at
        least its nearest-point distance away, so no density on the grid is closer to Pi#rho_0 than
        this (e1 from the nside-16 HEALPix centres: 0.0462, the plateau of the default run's W2).
    """
    c = np.asarray(getattr(support, "centers", support), dtype=float)
    lp = np.atleast_2d(np.asarray(limit_points, dtype=float))
    a = np.full(lp.shape[0], 1.0) if limit_weights is None else np.asarray(limit_weights, dtype=float).reshape(-1)
    if a.shape != (lp.shape[0],) or np.any(a < 0) or not a.sum() > 0:
        raise ValueError("limit_weights must be one mass >= 0 per limit point, with a positive sum")
    keep = a > 0
    d2 = np.min(cost_matrix(lp[keep], c, cost), axis=1)  # squared cost to the nearest support point
    return float(np.sqrt(np.dot(a[keep], d2) / a.sum()))


def concentration_diagnostics(points, weights, B, V, p: float = 0.25, limit=None, cost: str = "chordal",
                              spectral: SpectralData | None = None, strict_vp: bool = True,
                              wasserstein_kwargs: dict | None = None, grid=None) -> dict:
    r"""The paper's plotted quantities for one measure rho = sum_i w_i delta_{x_i}.

    Parameters
    ----------
    points : (n, d) array_like or Grid
        Atoms, or a grid (its centres) for a grid density.
    weights : (n,) array_like
        Masses (a probability measure: particles 1/n, a grid density f * areas).
    B, V : (d, d) array_like
        Score and value matrices (ignored if ``spectral`` is given).
    p : float, default 0.25
        Exponent of V_p (0 < p <= 1; with ``strict_vp`` it must satisfy 2p < dim E).
    limit : tuple (points, weights), optional
        The limit measure Pi#rho_0 of the *initial* measure (``limit_measure(...)``), for
        ``"w2_limit"`` = W2(rho, Pi#rho_0). Default: Pi#rho of this measure (the same thing for rho_0;
        for later rho, W2(rho, Pi#rho) <= sqrt(2 V_p(rho))).
    cost : {"chordal", "geodesic"}
    spectral : SpectralData, optional
        Precomputed ``spectral_data(B, V)``.
    strict_vp : bool
        Passed to :func:`spherepde.spectral.lyapunov_vp` as ``strict``.
    wasserstein_kwargs : dict, optional
        Extra arguments of :func:`spherepde.wasserstein.wasserstein2` (``max_size``, ``coarsen``).
    grid : Grid, optional
        For a grid density ``(grid.centers, f * grid.areas)`` on S^2: V_p by the grid path of
        :func:`spherepde.spectral.lyapunov_vp` (the exact singular weight integrated over each cell)
        instead of the sum over the centres, which is wrong for HEALPix (centres on E^perp: 1.1e6 for
        the uniform density at nside 16, p = 1/4, instead of 1.854). Points that are the centres of a
        HEALPix grid (RING order) are recognised as that grid's density without it.

    Returns
    -------
    dict
        ``w2_limit`` W2(rho, Pi#rho_0); ``alignment_E``, ``alignment_F``, ``alignment_F_abs``
        (int |P_S x|^2 d rho); ``V_p``; ``mass`` (total mass of rho); ``p``; for a grid density
        ``w2_floor``, the least W2 any density on the grid can have to the limit
        (:func:`w2_grid_floor`; 0 for particles), and ``w2_at_floor``, True when ``w2_limit`` <=
        ``W2_FLOOR_FACTOR`` x ``w2_floor`` (W2 is then at grid resolution: a plateau, not a rate).
    """
    if grid is None and hasattr(points, "cell_average"):
        grid, points = points, points.centers
    s = spectral if spectral is not None else spectral_data(B, V)
    x, w = _measure(points, weights)
    if grid is None:
        grid = _healpix_of(x)
    if grid is not None and getattr(grid, "dim", None) != 3:
        grid_vp = None
    else:
        grid_vp = grid
    out = {
        "mass": float(w.sum()),
        "alignment_E": alignment(x, w, s.E),
        "alignment_F": alignment(x, w, s.F),
        "alignment_F_abs": alignment(x, w, s.F_abs),
        "V_p": lyapunov_vp(x, w, s.E, p, strict=strict_vp, grid=grid_vp),
        "p": float(p),
        "w2_limit": np.nan,
        "w2_floor": 0.0,
        "w2_at_floor": False,
    }
    if limit is None:
        try:
            limit = limit_measure(x, w, None, None, spectral=s)
        except ValueError as exc:  # mass on E^perp with dim E >= 2: Pi#rho has no canonical image
            warnings.warn(f"w2_limit is NaN: {exc}; pass limit=limit_measure(...) of the initial measure",
                          RuntimeWarning, stacklevel=2)
            return out
    lp, lw = limit
    out["w2_limit"] = wasserstein2(x, w, lp, lw, cost=cost, **(wasserstein_kwargs or {}))
    if grid is not None:
        out["w2_floor"] = w2_grid_floor(grid, lp, lw, cost=cost)
        out["w2_at_floor"] = bool(out["w2_limit"] <= W2_FLOOR_FACTOR * out["w2_floor"])
    return out


def transition_time(t, align_E, align_F) -> float:
    """The E-to-F transition time t_EF of a series of alignments (Figure 4 of the paper).

    The first t > 0 at which int |P_F x|^2 drho_t exceeds int |P_E x|^2 drho_t *after* the E-alignment
    has led at some earlier saved time, linearly interpolated between the saved times ``t``. At t = 0 from
    the uniform rho_0 both are equal, so the lead is required. NaN if it does not happen in the window.
    """
    t, d = np.asarray(t, float), np.asarray(align_F, float) - np.asarray(align_E, float)
    seen_E = False
    for i in range(1, len(t)):
        if d[i - 1] < 0:
            seen_E = True
        if seen_E and d[i - 1] <= 0 < d[i]:
            return float(t[i - 1] + (t[i] - t[i - 1]) * (-d[i - 1]) / (d[i] - d[i - 1]))
    return float("nan")


def exit_time(t, align_E, level: float = 0.9) -> float:
    """The end of the E-phase t_exit: the first saved-time crossing at which the E-alignment falls back
    below ``level`` after having exceeded it (linearly interpolated); NaN if it does not happen."""
    t, aE = np.asarray(t, float), np.asarray(align_E, float)
    above = np.nonzero(aE > level)[0]
    if len(above) == 0:
        return float("nan")
    for i in range(above[0] + 1, len(t)):
        if aE[i] < level:
            return float(t[i - 1] + (t[i] - t[i - 1]) * (aE[i - 1] - level) / (aE[i - 1] - aE[i]))
    return float("nan")
