"""2-Wasserstein distances between discrete measures on S^(d-1).

Functions
---------
wasserstein2(points_a, weights_a, points_b, weights_b, cost="chordal", max_size=MAX_LP_SIZE, coarsen=None)
    W2 (not squared): exact, through POT's network simplex ``ot.emd2``, or the exact O(N log N) path
    when one side has at most two atoms (Pi#rho_0 for dim E = 1); optional coarsening beyond the LP limit.
wasserstein2_two_atoms(points, weights, atoms, atom_weights, cost="chordal")
    Exact W2 from any discrete measure to a measure with one or two atoms, in O(N log N).
coarsen_measure(points, weights, size, method="healpix", rng=0)
    Merge a measure onto at most ``size`` atoms; returns the atoms, their masses and the W2 displacement.
cost_matrix(points_a, points_b, cost="chordal")
    c(x, y) = |x - y|^2 (chordal) or arccos(<x, y>)^2 (geodesic).

A grid density enters as ``(grid.centers, f * grid.areas)``. Both measures are normalised to mass 1 after
checking that their total masses agree (relative ``mass_rtol``).
"""
from __future__ import annotations

import logging

import numpy as np

from ._checks import real_array

__all__ = ["wasserstein2", "wasserstein2_two_atoms", "coarsen_measure", "cost_matrix", "MAX_LP_SIZE",
           "COSTS"]

log = logging.getLogger(__name__)

#: Largest n_a * n_b solved by the exact LP (a 2.5e7-entry cost matrix is 200 MB; the network simplex
#: takes minutes beyond a few thousand atoms a side).
MAX_LP_SIZE = 25_000_000
COSTS = ("chordal", "geodesic")


def _measure(points, weights, name):
    x = np.atleast_2d(real_array(points, f"points_{name}"))
    w = real_array(weights, f"weights_{name}").reshape(-1)
    if x.ndim != 2 or x.shape[0] != w.shape[0]:
        raise ValueError(f"points_{name} (n, d) and weights_{name} (n,) must match, got {np.shape(points)} "
                         f"and {np.shape(weights)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(w))):
        raise ValueError(f"points_{name} and weights_{name} must be finite")
    if np.any(w < 0):
        raise ValueError(f"weights_{name} must be >= 0")
    keep = w > 0
    if not np.any(keep):
        raise ValueError(f"weights_{name} must have positive total mass")
    return x[keep], w[keep]


def _normalise_masses(wa, wb, mass_rtol):
    sa, sb = wa.sum(), wb.sum()
    if abs(sa - sb) > mass_rtol * max(sa, sb):
        raise ValueError(
            f"the two measures have different total masses {sa:.10g} and {sb:.10g} (relative difference "
            f"{abs(sa - sb) / max(sa, sb):.3e} > mass_rtol = {mass_rtol:g}); W2 compares probability measures"
        )
    return wa / sa, wb / sb


def cost_matrix(points_a, points_b, cost: str = "chordal") -> np.ndarray:
    """Ground cost c(x_i, y_j), shape (n_a, n_b).

    ``"chordal"``: |x - y|^2 (Euclidean in R^d); ``"geodesic"``: arccos(<x, y>)^2 (points normalised).
    On the sphere geodesic^2 / chordal^2 lies in [1, pi^2 / 4].
    """
    a = np.atleast_2d(points_a)
    b = np.atleast_2d(points_b)
    if cost == "chordal":
        sq = np.einsum("ij,ij->i", a, a)[:, None] + np.einsum("ij,ij->i", b, b)[None, :] - 2.0 * a @ b.T
        return np.maximum(sq, 0.0)
    if cost == "geodesic":
        an = a / np.linalg.norm(a, axis=1)[:, None]
        bn = b / np.linalg.norm(b, axis=1)[:, None]
        return np.arccos(np.clip(an @ bn.T, -1.0, 1.0)) ** 2
    raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")


def wasserstein2_two_atoms(points, weights, atoms, atom_weights, cost: str = "chordal",
                           mass_rtol: float = 1e-6) -> float:
    r"""Exact W2 between sum_i w_i delta_{x_i} and a measure with one or two atoms, in O(N log N).

    Parameters
    ----------
    points : (N, d) array_like
    weights : (N,) array_like
        Masses >= 0.
    atoms : (m, d) array_like, m in {1, 2}
        The atoms z_1 (, z_2), e.g. [e, -e] for Pi#rho_0 with dim E = 1.
    atom_weights : (m,) array_like
    cost : {"chordal", "geodesic"}

    Returns
    -------
    float
        W2 (not squared).

    Notes
    -----
    Every plan sends pi_i in [0, w_i] of x_i to z_1 and w_i - pi_i to z_2 with sum_i pi_i = m_1, and costs
    sum_i w_i c(x_i, z_2) + sum_i pi_i (c(x_i, z_1) - c(x_i, z_2)): a fractional knapsack, solved exactly
    by filling z_1 with the points of smallest c(x, z_1) - c(x, z_2) first (for the chordal cost and
    z_2 = -z_1 that is the largest <x, z_1>, as |x - e|^2 - |x + e|^2 = -4 <x, e>).
    """
    x, w = _measure(points, weights, "a")
    z, m = _measure(atoms, atom_weights, "b")
    if z.shape[0] > 2:
        raise ValueError(f"atoms must hold one or two points, got {z.shape[0]}")
    if z.shape[1] != x.shape[1]:
        raise ValueError(f"points and atoms must have the same dimension, got {x.shape[1]} and {z.shape[1]}")
    w, m = _normalise_masses(w, m, mass_rtol)
    c = cost_matrix(x, z, cost)
    if z.shape[0] == 1:
        return float(np.sqrt(max(np.dot(w, c[:, 0]), 0.0)))
    delta = c[:, 0] - c[:, 1]
    order = np.argsort(delta, kind="stable")
    ws = w[order]
    before = np.cumsum(ws) - ws
    pi = np.clip(m[0] - before, 0.0, ws)
    w2sq = np.dot(w, c[:, 1]) + np.dot(pi, delta[order])
    return float(np.sqrt(max(w2sq, 0.0)))


def _assign_nearest(x, centres, chunk=4096):
    lab = np.empty(x.shape[0], dtype=np.int64)
    for s in range(0, x.shape[0], chunk):
        lab[s:s + chunk] = np.argmax(x[s:s + chunk] @ centres.T, axis=1)
    return lab


def coarsen_measure(points, weights, size: int, method: str = "healpix", rng=0, iterations: int = 10):
    r"""Merge a measure on S^(d-1) onto at most ``size`` atoms.

    Parameters
    ----------
    points : (n, d) array_like
    weights : (n,) array_like
    size : int
        Largest number of atoms of the result.
    method : {"healpix", "kmeans"}
        ``"healpix"`` (d = 3 only): the mass of each HEALPix pixel (RING scheme, the largest nside with
        12 nside^2 <= size) goes to its mass-weighted mean direction. ``"kmeans"`` (any d): ``iterations``
        weighted spherical Lloyd steps from ``size`` atoms drawn with probability proportional to mass.
    rng : int or Generator
        Seed of the k-means initialisation.

    Returns
    -------
    centres : (m, d) ndarray
    masses : (m,) ndarray
    displacement : float
        sqrt(sum_i w_i |x_i - c(x_i)|^2) (chordal): the cost of the map sending each atom to its
        centre, an upper bound of the chordal W2 between the input and the result; by the triangle
        inequality a W2 computed on coarsened measures is off by at most the sum of the two
        displacements (geodesic cost: times pi / 2).
    """
    x = np.atleast_2d(real_array(points, "points"))
    w = real_array(weights, "weights").reshape(-1)
    if x.ndim != 2 or w.shape != (x.shape[0],):
        raise ValueError(f"points (n, d) and weights (n,) must match, got {x.shape} and {w.shape}")
    n, d = x.shape
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if n <= size:
        return x.copy(), w.copy(), 0.0
    if method == "healpix":
        if d != 3:
            raise ValueError(f"coarsen='healpix' needs d = 3, got d = {d}; use coarsen='kmeans'")
        import healpy as hp

        nside = int(np.floor(np.sqrt(size / 12.0)))
        if nside < 1:
            raise ValueError(f"coarsen='healpix' needs size >= 12, got {size}")
        lab = hp.vec2pix(nside, x[:, 0], x[:, 1], x[:, 2])
    elif method == "kmeans":
        from .sampling import as_generator

        g = as_generator(rng)
        p = w / w.sum()
        centres = x[g.choice(n, size=size, replace=False, p=p if np.count_nonzero(p) >= size else None)]
        for _ in range(iterations):
            lab = _assign_nearest(x, centres)
            acc = np.zeros_like(centres)
            np.add.at(acc, lab, w[:, None] * x)
            nrm = np.linalg.norm(acc, axis=1)
            ok = nrm > 0
            centres[ok] = acc[ok] / nrm[ok, None]
        lab = _assign_nearest(x, centres)
    else:
        raise ValueError(f"method must be 'healpix' or 'kmeans', got {method!r}")
    uniq, inv = np.unique(lab, return_inverse=True)
    inv = inv.reshape(-1)
    masses = np.bincount(inv, weights=w, minlength=uniq.size)
    acc = np.zeros((uniq.size, d))
    np.add.at(acc, inv, w[:, None] * x)
    nrm = np.linalg.norm(acc, axis=1)
    # an antipodally balanced cell has no mean direction: fall back to its heaviest point
    for c in np.flatnonzero(nrm <= 1e-14 * np.maximum(masses, 1e-300)):
        members = np.flatnonzero(inv == c)
        acc[c] = x[members[np.argmax(w[members])]]
        nrm[c] = np.linalg.norm(acc[c])
    centres = acc / nrm[:, None]
    disp = float(np.sqrt(np.sum(w * np.sum((x - centres[inv]) ** 2, axis=1))))
    return centres, masses, disp


def wasserstein2(points_a, weights_a, points_b, weights_b, cost: str = "chordal",
                 max_size: int = MAX_LP_SIZE, coarsen: str | None = None, mass_rtol: float = 1e-6,
                 num_iter_max: int | None = None) -> float:
    r"""2-Wasserstein distance W2 (not squared) between two discrete measures on S^(d-1).

    Parameters
    ----------
    points_a : (n_a, d) array_like
    weights_a : (n_a,) array_like
        Masses >= 0 (zero-mass atoms are dropped).
    points_b : (n_b, d) array_like
    weights_b : (n_b,) array_like
    cost : {"chordal", "geodesic"}, default "chordal"
        Ground cost |x - y|^2 or arccos(<x, y>)^2.
    max_size : int, default 2.5e7
        Largest n_a * n_b given to the exact LP (after dropping zero masses).
    coarsen : {None, "healpix", "kmeans"}
        Beyond ``max_size``: None raises ``ValueError``; otherwise the larger side(s) are merged with
        :func:`coarsen_measure` until n_a * n_b <= max_size and the LP is solved on the result. The
        coarsening error bound (sum of the displacements) is logged at INFO level.
    mass_rtol : float, default 1e-6
        Largest relative difference of the two total masses; both are then normalised to 1.
    num_iter_max : int, optional
        Network-simplex iteration cap (default max(1e6, 50 (n_a + n_b))); not converging raises.

    Returns
    -------
    float
        W2 = (min_pi int c d pi)^{1/2}.

    Notes
    -----
    Exact paths: a side with one or two atoms (Pi#rho_0 for dim E = 1) uses
    :func:`wasserstein2_two_atoms` (O(N log N)); otherwise POT's exact network simplex ``ot.emd2``.
    """
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")
    xa, wa = _measure(points_a, weights_a, "a")
    xb, wb = _measure(points_b, weights_b, "b")
    if xa.shape[1] != xb.shape[1]:
        raise ValueError(f"points_a and points_b must have the same dimension d, got {xa.shape[1]} and "
                         f"{xb.shape[1]}")
    wa, wb = _normalise_masses(wa, wb, mass_rtol)
    if xb.shape[0] <= 2:
        return wasserstein2_two_atoms(xa, wa, xb, wb, cost)
    if xa.shape[0] <= 2:
        return wasserstein2_two_atoms(xb, wb, xa, wa, cost)

    na, nb = xa.shape[0], xb.shape[0]
    if na * nb > max_size:
        if coarsen is None:
            raise ValueError(
                f"exact W2 needs an n_a x n_b = {na} x {nb} = {na * nb:.3g} LP, above max_size = {max_size:.3g}; "
                "pass coarsen='healpix' (d = 3) or coarsen='kmeans' to merge atoms first, or raise max_size"
            )
        side = int(np.floor(np.sqrt(max_size)))
        if na <= side:
            size_a, size_b = na, max_size // na
        elif nb <= side:
            size_a, size_b = max_size // nb, nb
        else:
            size_a = size_b = side
        xa, wa, da = coarsen_measure(xa, wa, size_a, coarsen)
        xb, wb, db = coarsen_measure(xb, wb, size_b, coarsen)
        log.info("wasserstein2: coarsened (%s) to %d x %d atoms; W2 error <= %.3e", coarsen, xa.shape[0],
                 xb.shape[0], (da + db) * (np.pi / 2 if cost == "geodesic" else 1.0))

    import ot

    M = cost_matrix(xa, xb, cost)
    it = num_iter_max if num_iter_max is not None else max(1_000_000, 50 * (xa.shape[0] + xb.shape[0]))
    val, info = ot.emd2(wa, wb, M, numItermax=int(it), log=True)
    if info.get("warning"):
        raise RuntimeError(f"ot.emd2 did not solve the transport LP: {info['warning']} (raise num_iter_max)")
    return float(np.sqrt(max(float(val), 0.0)))
