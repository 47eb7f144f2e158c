"""Diagnostics of a measure on S^(d-1) that the paper plots, for PDE and particle runs alike.

Functions
---------
alignment(points, weights, basis)
    int |P_S x|^2 d rho for the subspace S with orthonormal rows ``basis``.
interaction_energy(points, weights, B, beta, log=False)
    E_B(rho) = sum_ij w_i w_j exp(beta <x_i, B x_j>) (or its logarithm), without overflow.
concentration_diagnostics(points, weights, B, V, p=0.25, limit=None, ...)
    Dict of W2 to Pi#rho_0, alignment with E, F and F_abs, and V_p.

All take a discrete measure ``(points (n, d), weights (n,))``; a grid density enters as
``(grid.centers, f * grid.areas)``. Conventions: score <x, B y>, value V y, A = V B^T.
"""
from __future__ import annotations

import logging

import numpy as np
from scipy.special import logsumexp

from ._checks import finite_float, real_array
from .kernels.particles import launch, softmax_mean
from .spectral import SpectralData, as_basis, lyapunov_vp, spectral_data
from .wasserstein import wasserstein2

__all__ = ["alignment", "interaction_energy", "concentration_diagnostics", "transition_time", "exit_time"]

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


def concentration_diagnostics(points, weights, B, V, p: float = 0.25, limit=None, cost: str = "chordal",
                              spectral: SpectralData | None = None, strict_vp: bool = True,
                              wasserstein_kwargs: dict | None = None, grid=None) -> dict:
    r"""The paper's plotted quantities for one measure rho = sum_i w_i delta_{x_i}.

    Parameters
    ----------
    points : (n, d) array_like
    weights : (n,) array_like
        Masses (a probability measure: particles 1/n, a grid density f * areas).
    B, V : (d, d) array_like
        Score and value matrices (ignored if ``spectral`` is given).
    p : float, default 0.25
        Exponent of V_p (0 < p <= 1; with ``strict_vp`` it must satisfy 2p < dim E).
    limit : tuple (points, weights), optional
        The limit measure Pi#rho_0 of the *initial* measure (``limit_measure(...)``); when given, the
        distance W2(rho, Pi#rho_0) is returned under ``"w2_limit"`` (else NaN).
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
        instead of the sum over the centres, which is wrong for HEALPix (centres on E^perp).

    Returns
    -------
    dict
        ``w2_limit`` W2(rho, Pi#rho_0); ``alignment_E``, ``alignment_F``, ``alignment_F_abs``
        (int |P_S x|^2 d rho); ``V_p``; ``mass`` (total mass of rho); ``p``.
    """
    s = spectral if spectral is not None else spectral_data(B, V)
    x, w = _measure(points, weights)
    out = {
        "mass": float(w.sum()),
        "alignment_E": alignment(x, w, s.E),
        "alignment_F": alignment(x, w, s.F),
        "alignment_F_abs": alignment(x, w, s.F_abs),
        "V_p": lyapunov_vp(x, w, s.E, p, strict=strict_vp, grid=grid),
        "p": float(p),
        "w2_limit": np.nan,
    }
    if limit is not None:
        lp, lw = limit
        out["w2_limit"] = wasserstein2(x, w, lp, lw, cost=cost, **(wasserstein_kwargs or {}))
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
