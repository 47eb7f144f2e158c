"""Spectral objects of (B, V), the projection Pi, the limit measure Pi#rho and the Lyapunov functional V_p.

Functions
---------
spectral_data(B, V, tol=1e-8)
    A = V B^T, mu_1, mu_2, gamma, E, P_E, F, F_abs, sigma_max(B) and the status of Assumption 1.
projection(x, E)
    Pi(x) = P_E x / |P_E x|.
limit_measure(points, weights, B, V)
    (points, weights) of Pi#rho for the measure rho = sum_i w_i delta_{x_i}.
lyapunov_vp(points, weights, E, p, grid=None)
    V_p(rho) = int |(I - P_E) x|^{2p} / |P_E x|^{2p} d rho: a sum over atoms (particles), or, with
    ``grid``, the integral of the piecewise-constant grid density against the exact singular weight.
vp_cell_averages(grid, E, p)
    (1/|C_i|) int_{C_i} |(I - P_E) x|^{2p} / |P_E x|^{2p} dA for every cell of an S^2 grid.

Subspace bases are (k, d) arrays with orthonormal **rows** (a (d,) vector is read as k = 1), so that
P_E x = (x @ E.T) @ E for points stored as rows. Conventions: score <x, B y>, value V y, A = V B^T.
A grid density enters as ``(grid.centers, f * grid.areas)``; for V_p pass ``grid=grid`` as well (the
weight is singular on E^perp, where HEALPix has pixel centres).
"""
from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_matrix, finite_float, real_array

__all__ = ["SpectralData", "spectral_data", "projection", "limit_measure", "lyapunov_vp", "vp_cell_averages",
           "lyapunov_vp_uniform",
           "as_basis", "PERP_TOL", "MAX_CONDITION"]

#: Points with |P_E x| <= PERP_TOL are treated as lying on E^perp, where Pi is undefined.
PERP_TOL = 1e-12
#: Largest condition number of B accepted as "invertible" (as ZeroTemperature).
MAX_CONDITION = 1e12


def as_basis(E, d: int | None = None, name: str = "E") -> np.ndarray:
    """Return a (k, d) array with orthonormal rows, or raise naming ``name``."""
    b = np.atleast_2d(np.array(E, dtype=float))
    if b.ndim != 2 or (d is not None and b.shape[1] != d) or b.shape[0] > b.shape[1] or b.shape[0] == 0:
        raise ValueError(f"{name} must be a (k, d) array of orthonormal rows (1 <= k <= d"
                         f"{'' if d is None else f' = {d}'}), got shape {b.shape}")
    if not np.allclose(b @ b.T, np.eye(b.shape[0]), atol=1e-8):
        raise ValueError(f"{name} must have orthonormal rows (E @ E.T = I within 1e-8)")
    return b


def _eigspace_sym(M: np.ndarray, select: str, tol: float):
    """Eigen-decomposition of a symmetric M and the eigenspace of the top (or top-|.|) eigenvalue."""
    lam, vec = np.linalg.eigh(M)
    scale = max(np.max(np.abs(lam)), np.finfo(float).tiny)
    key = lam if select == "max" else np.abs(lam)
    top = key.max()
    sel = key >= top - tol * scale
    basis = vec[:, sel].T.copy()
    # sign convention: the largest-magnitude entry of each basis vector is positive
    idx = np.argmax(np.abs(basis), axis=1)
    basis *= np.sign(basis[np.arange(basis.shape[0]), idx])[:, None]
    return lam, basis, lam[sel]


def _eigspace_general(M: np.ndarray, select: str, tol: float) -> np.ndarray:
    """Real invariant subspace (orthonormal rows) of the eigenvalues of M with the largest real part
    (``select="max"``) or largest modulus (``"abs"``); complex pairs contribute Re and Im parts."""
    lam, vec = np.linalg.eig(M)
    scale = max(np.max(np.abs(lam)), np.finfo(float).tiny)
    key = lam.real if select == "max" else np.abs(lam)
    sel = key >= key.max() - tol * scale
    cols = np.concatenate([vec[:, sel].real, vec[:, sel].imag], axis=1)
    u, s, _ = np.linalg.svd(cols, full_matrices=False)
    rank = int(np.sum(s > 1e-8 * s.max()))
    return u[:, :rank].T.copy()


@dataclass(frozen=True, eq=False)
class SpectralData:
    r"""The spectral objects of the concentration theory for one pair (B, V).

    Attributes
    ----------
    B, V : (d, d) ndarray
        Score matrix (score <x, B y>) and value matrix.
    A : (d, d) ndarray
        A = V B^T.
    eigenvalues : (d,) ndarray
        Eigenvalues of the symmetric part (A + A^T)/2, increasing (those of A when Assumption 1 holds).
    mu1, mu2 : float
        The largest and the second largest *distinct* eigenvalue (mu2 = -inf if A = mu1 I).
    gamma : float
        Spectral gap mu1 - mu2 (inf if A = mu1 I).
    E : (k, d) ndarray
        Orthonormal basis (rows) of the mu1-eigenspace of A; ``k = E.shape[0]``.
    P_E : (d, d) ndarray
        Orthogonal projection onto E.
    F : (kF, d) ndarray
        Orthonormal basis of the eigenspace of V for its largest eigenvalue (largest real part if V is
        not symmetric; complex pairs give their real invariant plane).
    F_abs : (kA, d) ndarray
        Orthonormal basis of the eigenspace(s) of V for the eigenvalue(s) of largest modulus.
    sigma_max : float
        Largest singular value of B.
    condition_B : float
        Condition number of B.
    B_invertible, A_symmetric : bool
        The two parts of Assumption 1.
    tol : float
        Relative tolerance used (symmetry: |A - A^T|_F <= tol |A|_F; eigenvalue clusters: tol |A|_2).

    Notes
    -----
    Assumption 1: B invertible and A = V B^T symmetric. When A is not symmetric the objects above are
    computed from its symmetric part (for exploration only) and :meth:`check` raises.
    """

    B: np.ndarray
    V: np.ndarray
    A: np.ndarray
    eigenvalues: np.ndarray
    mu1: float
    mu2: float
    gamma: float
    E: np.ndarray
    P_E: np.ndarray
    F: np.ndarray
    F_abs: np.ndarray
    sigma_max: float
    condition_B: float
    B_invertible: bool
    A_symmetric: bool
    tol: float
    asymmetry: float = field(repr=False, default=0.0)

    @property
    def k(self) -> int:
        """dim E."""
        return self.E.shape[0]

    @property
    def dim(self) -> int:
        return self.A.shape[0]

    @property
    def assumption1(self) -> bool:
        """True when B is invertible and A = V B^T is symmetric."""
        return self.B_invertible and self.A_symmetric

    def failures(self) -> list[str]:
        """Human-readable reasons why Assumption 1 fails (empty if it holds)."""
        out = []
        if not self.B_invertible:
            out.append(f"B is not invertible (condition number {self.condition_B:.3e} > {MAX_CONDITION:.0e})")
        if not self.A_symmetric:
            out.append(f"A = V B^T is not symmetric (|A - A^T|_F / |A|_F = {self.asymmetry:.3e} > tol = "
                       f"{self.tol:g})")
        return out

    def check(self) -> "SpectralData":
        """Raise ``ValueError`` naming the failing part(s) of Assumption 1; return self if it holds."""
        f = self.failures()
        if f:
            raise ValueError("Assumption 1 fails: " + "; ".join(f))
        return self


def spectral_data(B, V, tol: float = 1e-8) -> SpectralData:
    """Spectral objects of (B, V); see :class:`SpectralData`.

    Parameters
    ----------
    B, V : (d, d) array_like
        Score matrix (score <x, B y>) and value matrix.
    tol : float, default 1e-8
        Relative tolerance for the symmetry of A and for grouping equal eigenvalues.

    Returns
    -------
    SpectralData
        Always returned; ``.assumption1`` says whether Assumption 1 holds and ``.check()`` raises if not.

    Examples
    --------
    >>> import numpy as np
    >>> s = spectral_data(np.diag([-1., -1, 1]), np.diag([-1., 1, -2]))
    >>> s.mu1, s.gamma, s.k
    (1.0, 2.0, 1)
    """
    B = as_matrix(B, "B")
    V = as_matrix(V, "V", d=B.shape[0])
    tol = finite_float(tol, "tol", low=0.0, low_open=True)
    A = V @ B.T
    nA = np.linalg.norm(A)
    asym = float(np.linalg.norm(A - A.T) / nA) if nA > 0 else 0.0
    A_sym = asym <= tol
    cond = float(np.linalg.cond(B))
    B_inv = bool(np.isfinite(cond) and cond <= MAX_CONDITION)

    lam, E, _ = _eigspace_sym(0.5 * (A + A.T), "max", tol)
    mu1 = float(lam.max())
    scale = max(np.max(np.abs(lam)), np.finfo(float).tiny)
    below = lam[lam < mu1 - tol * scale]
    mu2 = float(below.max()) if below.size else -np.inf
    gamma = mu1 - mu2
    if below.size == 0:
        mu1 = float(np.mean(lam))
    P_E = E.T @ E

    V_symmetric = np.linalg.norm(V - V.T) <= tol * max(np.linalg.norm(V), np.finfo(float).tiny)
    if V_symmetric:
        _, F, _ = _eigspace_sym(0.5 * (V + V.T), "max", tol)
        _, F_abs, _ = _eigspace_sym(0.5 * (V + V.T), "abs", tol)
    else:
        F = _eigspace_general(V, "max", tol)
        F_abs = _eigspace_general(V, "abs", tol)

    for a in (A, lam, E, P_E, F, F_abs):
        a.setflags(write=False)
    return SpectralData(
        B=B, V=V, A=A, eigenvalues=lam, mu1=mu1, mu2=mu2, gamma=float(gamma), E=E, P_E=P_E, F=F, F_abs=F_abs,
        sigma_max=float(np.linalg.norm(B, 2)), condition_B=cond, B_invertible=B_inv, A_symmetric=bool(A_sym),
        tol=tol, asymmetry=asym,
    )


def projection(x, E, perp_tol: float = PERP_TOL) -> np.ndarray:
    """Pi(x) = P_E x / |P_E x| for points ``x`` (n, d) and the subspace with orthonormal rows ``E`` (k, d).

    Raises
    ------
    ValueError
        If a point lies on E^perp (|P_E x| <= perp_tol), where Pi is undefined. :func:`limit_measure`
        handles such points explicitly.
    """
    x = np.asarray(x, dtype=float)
    single = x.ndim == 1
    x = np.atleast_2d(x)
    Eb = as_basis(E, x.shape[1])
    c = x @ Eb.T
    nrm = np.linalg.norm(c, axis=1)
    bad = nrm <= perp_tol
    if np.any(bad):
        raise ValueError(
            f"Pi(x) = P_E x / |P_E x| is undefined on E^perp: {int(bad.sum())} point(s) have |P_E x| <= "
            f"{perp_tol:g} (first index {int(np.flatnonzero(bad)[0])})"
        )
    y = (c / nrm[:, None]) @ Eb
    return y[0] if single else y


def _check_measure(points, weights, d=None):
    x = np.atleast_2d(real_array(points, "points"))
    if x.ndim != 2 or (d is not None and x.shape[1] != d):
        raise ValueError(f"points must have shape (n, {d if d else 'd'}), got {np.shape(points)}")
    w = real_array(weights, "weights").reshape(-1)
    if w.shape != (x.shape[0],):
        raise ValueError(f"weights must have shape ({x.shape[0]},) (one per point: points has {x.shape[0]} rows), "
                         f"got {np.shape(weights)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(w))):
        raise ValueError("points and weights must be finite")
    if np.any(w < 0):
        raise ValueError("weights must be >= 0")
    return x, w


def limit_measure(points, weights, B, V, spectral: SpectralData | None = None, perp_tol: float = PERP_TOL,
                  merge_decimals: int = 12):
    r"""The limit measure Pi#rho of rho = sum_i w_i delta_{x_i} (a grid density: centres, f * areas).

    Parameters
    ----------
    points : (n, d) array_like
        Support points (unit rows).
    weights : (n,) array_like
        Masses >= 0 (kept as given: the total mass is preserved).
    B, V : (d, d) array_like
        Score and value matrices; E is the top eigenspace of A = V B^T.
    spectral : SpectralData, optional
        Precomputed ``spectral_data(B, V)`` (B and V are then ignored).
    perp_tol : float
        Points with |P_E x| <= perp_tol count as lying on E^perp.
    merge_decimals : int
        For k >= 2, projected points equal after rounding to this many decimals are merged.

    Returns
    -------
    points : (m, d) ndarray
    weights : (m,) ndarray

    Notes
    -----
    - k = dim E = 1, E = span(e) (e the eigenvector, sign as returned by ``spectral_data``):
      Pi#rho = rho(<e, x> > 0) delta_e + rho(<e, x> < 0) delta_{-e}; mass on E^perp (<e, x> = 0 within
      perp_tol) is split equally between the two atoms (for a bounded density it is zero; for grid
      centres exactly on the equator this is the symmetric choice). Always two atoms [e, -e], possibly
      with zero mass.
    - k >= 2: the atoms Pi(x_i) with their masses, merged where equal (k = 2: a measure on the great
      circle E cap S^{d-1}; k = d: Pi is the identity, the input up to merging). Mass on E^perp has no
      canonical image and raises ``ValueError``.

    Assumption 1 is not enforced here (E is the top eigenspace of the symmetric part of A); call
    ``spectral_data(B, V).check()`` to enforce it.
    """
    s = spectral if spectral is not None else spectral_data(B, V)
    x, w = _check_measure(points, weights, s.dim)
    E = s.E
    k = E.shape[0]
    if k == 1:
        e = E[0]
        c = x @ e
        plus = w[c > perp_tol].sum()
        minus = w[c < -perp_tol].sum()
        zero = w[np.abs(c) <= perp_tol].sum()
        return np.stack([e, -e]), np.array([plus + 0.5 * zero, minus + 0.5 * zero])
    c = x @ E.T
    nrm = np.linalg.norm(c, axis=1)
    bad = nrm <= perp_tol
    if np.any(bad & (w > 0)):
        raise ValueError(
            f"Pi#rho is undefined: mass {w[bad].sum():.3e} on {int(bad.sum())} point(s) lies on E^perp "
            f"(|P_E x| <= {perp_tol:g}) and dim E = {k} >= 2 gives it no canonical image; remove or move it"
        )
    keep = ~bad
    y = (c[keep] / nrm[keep, None]) @ E
    key = np.round(y, merge_decimals) + 0.0  # + 0.0 turns -0.0 into 0.0
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    wm = np.bincount(inv, weights=w[keep], minlength=uniq.shape[0])
    ym = np.zeros_like(uniq)
    np.add.at(ym, inv, y)
    ym /= np.linalg.norm(ym, axis=1)[:, None]
    return ym, wm


def lyapunov_vp(points, weights, E, p: float, strict: bool = True, *, grid=None) -> float:
    r"""V_p(rho) = int |(I - P_E) x|^{2p} / |P_E x|^{2p} d rho(x).

    Two paths: a discrete measure rho = sum_i w_i delta_{x_i} (particles; the sum over atoms), or a grid
    density (``grid`` given): the piecewise-constant density f_i = w_i / |C_i| integrated against the
    exact weight, V_p = sum_i w_i avg_{C_i} w_p, with the cell averages of the singular weight from
    :func:`vp_cell_averages` (exact up to quadrature round-off, also for cells on E^perp).

    Parameters
    ----------
    points : (n, d) array_like
        Unit rows (ignored with ``grid``; ``grid.centers`` by convention). A grid object may be passed
        here instead, as shorthand for ``grid=points``.
    weights : (n,) array_like
        Masses >= 0 (for a grid density: ``f * grid.areas``).
    E : (k, d) array_like
        Orthonormal basis (rows) of E.
    p : float
        Exponent, 0 < p <= 1.
    strict : bool, default True
        Raise when 2p >= k: V_p is then infinite for every bounded density, so a finite value computed
        from a quadrature (grid centres) or from particles is a discretisation artefact. Pass
        ``strict=False`` to evaluate the sum anyway (meaningful for genuinely atomic measures; the grid
        path then returns ``inf`` unless no mass lies in a cell that meets the singular set).
    grid : Grid, optional
        A HEALPix grid or a 3-d TensorGrid (S^2): use the grid path.

    Returns
    -------
    float
        V_p (``inf`` if some mass lies on E^perp, |P_E x| <= ``PERP_TOL``: with a RuntimeWarning that
        names the grid path, since grid centres on E^perp are the usual cause).

    Notes
    -----
    Near E^perp the integrand behaves like dist(x, E^perp)^{-2p} on a set of codimension k, integrable
    iff 2p < k (MODEL.md). For uniform rho on S^2 and k = 1 this means p < 1/2 (V_p = B(1/2 - p, 1 + p)/2).
    Do not use the particle path with grid centres: HEALPix has centres on E^perp for E = span(e_1)
    (V_p ~ 1e6 to 1e13 from one cell), and elsewhere it underestimates V_p at p near 1/2.
    """
    if grid is None and hasattr(points, "cell_average"):
        grid, points = points, points.centers
    p = finite_float(p, "p", low=0.0, high=1.0, low_open=True)
    Eb = as_basis(E)
    k = Eb.shape[0]
    if grid is not None:
        w = np.asarray(weights, dtype=float).reshape(-1)
        if w.shape != (grid.n_cells,):
            raise ValueError(f"weights must have shape ({grid.n_cells},) (f * grid.areas), got {np.shape(weights)}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be finite and >= 0")
    else:
        x, w = _check_measure(points, weights, Eb.shape[1])
    if strict and 2 * p >= k:
        raise ValueError(
            f"V_p is infinite for a bounded density when 2p >= dim E: p = {p:g}, dim E = {k} "
            f"(allowed: p < {k / 2:g}); pass strict=False to sum over atoms anyway"
        )
    if grid is not None:
        avg = vp_cell_averages(grid, Eb, p)
        pos = w > 0
        if np.any(pos & ~np.isfinite(avg)):
            return np.inf
        return float(np.dot(w[pos], avg[pos]))
    c = x @ Eb.T
    pe2 = np.einsum("ij,ij->i", c, c)
    perp2 = np.maximum(np.einsum("ij,ij->i", x, x) - pe2, 0.0)
    pos = w > 0
    on_perp = pos & (pe2 <= PERP_TOL ** 2)  # cos(pi/2) = 6e-17: round-off of a point on E^perp
    if np.any(on_perp):
        import warnings

        warnings.warn(
            f"V_p = inf: {int(on_perp.sum())} atom(s) with mass lie on E^perp (|P_E x| <= {PERP_TOL:g}; the sum "
            "over atoms would be round-off, e.g. 3e12 for HEALPix centres). For a grid density pass grid=<the "
            "grid> (exact cell integrals of the weight: 9.73 for the uniform density, p = 0.45); for particles "
            "V_p is infinite", RuntimeWarning, stacklevel=2)
        return np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(pos, (perp2 / np.where(pe2 > 0, pe2, 1.0)) ** p, 0.0)
    return float(np.sum(w * ratio))


def lyapunov_vp_uniform(d: int, k: int, p: float) -> float:
    r"""V_p of the uniform probability measure on S^{d-1} for a subspace E of dimension k, exactly.

    With x uniform, r = |P_E x|^2 has the Beta(k/2, (d-k)/2) law, so
    V_p = E[((1 - r)/r)^p] = B(k/2 - p, (d-k)/2 + p) / B(k/2, (d-k)/2)
    (0 for k = d; infinite when 2p >= k, which is an error here). Examples: d = 3, k = 1:
    B(1/2 - p, 1 + p)/2; d = 2, k = 1: 1/cos(pi p).
    """
    from scipy.special import betaln

    d = int(d)
    k = int(k)
    if d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d}")
    if not 1 <= k <= d:
        raise ValueError(f"k (dim E) must be in 1..d = 1..{d}, got {k}")
    p = finite_float(p, "p", low=0.0, high=1.0, low_open=True)
    if 2 * p >= k:
        raise ValueError(f"V_p is infinite when 2p >= dim E: p = {p:g}, k = {k} (allowed: p < {k / 2:g})")
    if k == d:
        return 0.0
    a, b = 0.5 * k, 0.5 * (d - k)
    return float(np.exp(betaln(a - p, b + p) - betaln(a, b)))


# ---------------------------------------------------------------------------------------------------
# Grid path of V_p: exact cell integrals of the singular weight on S^2.
#
# On S^2 the weight depends on one coordinate u = <a, x> only:
#   k = 1, E = span(a):      w_p = ((1 - u^2) / u^2)^p     (singular on the great circle u = 0),
#   k = 2, E^perp = span(a): w_p = (u^2 / (1 - u^2))^p     (singular at the points u = +-1),
#   k = 3:                   w_p = 0.
# With H' = phi (phi(u) the weight as a function of u) the tangent field F = H(u) (a - u x) / (1 - u^2)
# has div_S F = phi(u) (div_S(a - u x) = -2u on S^2), so by the divergence theorem
#   int_C phi(<a, x>) dA = sum over the edges of C of int (H(u) - H_ref) <a, dX/dtau x X> / (1 - u^2) dtau,
# exactly, for any constant H_ref for which F - H_ref (a - u x)/(1 - u^2) is regular in C (the second field
# is divergence-free with point sources at u = +-1): H_ref = 0 for cells that meet u = 0 (they contain
# neither pole +-a), H_ref = sign(u) H(1) otherwise (regular at the pole on the cell's side).
# H has a closed form (incomplete beta): H(u) = sign(u) H(1) I_{u^2}(al, be) with (al, be) = (1/2 - p,
# 1 + p) for k = 1 and (1/2 + p, 1 - p) for k = 2, H(1) = B(al, be) / 2, and H(1) - H(|u|) =
# H(1) I_{1 - u^2}(be, al) without cancellation near the poles. The area integral with its
# singularity becomes 1-d integrals along the cells' (exact, curved) edges of a *bounded* integrand
# (H ~ |u|^{1 - 2p} at u = 0 for k = 1), which Gauss rules integrate well except next to u = 0: there the
# edge is split at the root (bisection) and integrated with Gauss rules on subintervals graded
# geometrically towards it (hp-quadrature), which converges exponentially for the |tau - tau*|^{1-2p}
# branch point; edges that merely pass near u = 0 are graded towards the near end as well.
_VP_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: The same caches for HEALPix grids by their parameters, so that a grid rebuilt from a configuration (a
#: results file's load, the next member of a sweep on the same worker) finds them: the cell integrals
#: cost 0.6 s at nside 16, as much as a short run. The last 2 resolutions are kept.
_VP_SHARED: "collections.OrderedDict" = collections.OrderedDict()


#: V_p cell averages of adaptive HEALPix cells by their NUNIQ, per (E, p): the cells of an adaptive run's saved
#: states are mostly the same from one state to the next (a regrid changes a few percent of them), and a cell's
#: average depends on that cell alone, so each is integrated once (:func:`_adaptive_cell_averages`). Before, every
#: state's grid was a new one and paid for all its cells: 3.4 s a state at 13k cells (beside another job), ~400 s of
#: a sweep member's post-processing at beta 300 (121 states), as long as the run itself; now 10.6 s in all. The last
#: 2 (E, p) are kept, each with at most _VP_CELLS_MAX cells (beyond it the store starts again).
_VP_CELLS: "collections.OrderedDict" = collections.OrderedDict()
_VP_CELLS_MAX = 4_000_000


class _CellSubset:
    """The listed cells of an adaptive HEALPix grid, as :class:`_Edges` and :func:`_axial_cell_integrals` read a
    grid (each cell's own face square; no tiling needed)."""

    def __init__(self, grid, cells):
        self._face, self._x0, self._y0, self._h = (grid._face[cells], grid._x0[cells], grid._y0[cells],
                                                   grid._h[cells])
        self.centers = grid.centers[cells]
        self.areas = grid.areas[cells]
        self.n_cells = len(cells)


def _adaptive_cell_averages(grid, key, a, H) -> np.ndarray:
    """The V_p cell averages of an adaptive grid's cells, the ones not met before integrated now and stored by
    NUNIQ. A cell's value is the same bits whichever cells share its batch (:func:`_dot3`, :func:`_wsum`), so
    the result does not depend on what was asked before."""
    uniq = np.asarray(grid.uniq, np.int64)
    known, vals = _VP_CELLS.pop(key, (np.empty(0, np.int64), np.empty(0)))
    _VP_CELLS[key] = (known, vals)
    while len(_VP_CELLS) > 2:
        _VP_CELLS.popitem(last=False)
    pos = np.minimum(np.searchsorted(known, uniq), max(len(known) - 1, 0))
    hit = (known[pos] == uniq) if len(known) else np.zeros(len(uniq), bool)
    miss = np.flatnonzero(~hit)
    if len(miss):
        sub = _CellSubset(grid, miss)
        integ, _ = _axial_cell_integrals(sub, a, H)
        new_u, new_v = uniq[miss], integ / sub.areas
        if len(known) + len(new_u) > _VP_CELLS_MAX:  # start the store again from these cells
            known, vals = known[:0], vals[:0]
        allu = np.concatenate([known, new_u])
        order = np.argsort(allu, kind="stable")
        known, vals = allu[order], np.concatenate([vals, new_v])[order]
        _VP_CELLS[key] = (known, vals)
        pos = np.searchsorted(known, uniq)
    return vals[pos].copy()


def _vp_cache_for(grid) -> dict:
    nside = getattr(grid, "nside", None)
    if nside is None or type(grid).__name__ != "HealpixGrid":
        return _VP_CACHE.setdefault(grid, {})
    key = (int(nside), int(grid.edge_points), int(getattr(grid, "cell_order", 0)))
    d = _VP_SHARED.pop(key, None)
    if d is None:
        d = {}
    _VP_SHARED[key] = d
    while len(_VP_SHARED) > 2:
        _VP_SHARED.popitem(last=False)
    return d
_U_ZERO = 1e-14  # |u| below this is round-off of a point on u = 0 (pixel edges on E^perp: H must be 0 there)
_N_PLAIN = 16  # Gauss points per edge away from u = 0
_N_SUB, _N_SAMPLE = 10, 8  # Gauss points per subinterval; subintervals per edge near u = 0
_GRADE, _LEVELS = 0.35, 28  # geometric grading ratio and depth (innermost width 0.35^28 ~ 2e-13)
_NEAR = 0.5  # a sub-interval within _NEAR edge lengths of u = 0 or u = +-1 is graded


def _gauss01(n: int):
    t, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * (t + 1.0), 0.5 * w


class _Edges:
    """The 4 edges of every cell of an S^2 grid, oriented so that W = dX/dtau x X points out of the
    cell, tau in [0, 1]; edge j of cell i has index 4 i + j."""

    def __init__(self, grid):
        self.grid = grid
        N = grid.n_cells
        if hasattr(grid, "_face") and (hasattr(grid, "_x0") or hasattr(grid, "_ix")):
            # HEALPix, uniform or adaptive: lattice segments of the face map (square side h per cell)
            if hasattr(grid, "_x0"):  # adaptive: each cell its own corner and size
                x0, y0, h = grid._x0, grid._y0, grid._h
            else:
                h = np.full(N, 1.0 / grid.nside)
                x0, y0 = grid._ix * h, grid._iy * h
            # counter-clockwise in (x, y) (the face map preserves orientation): SE, NE, NW, SW
            sx = np.stack([x0, x0 + h, x0 + h, x0], 1)
            sy = np.stack([y0, y0, y0 + h, y0 + h], 1)
            z = np.zeros(N)
            dx = np.stack([h, z, -h, z], 1)
            dy = np.stack([z, h, z, -h], 1)
            self.kind = "healpix"
            self.face = np.repeat(grid._face, 4)
        elif getattr(grid, "dim", None) == 3 and hasattr(grid, "lo"):  # TensorGrid: boxes in (psi, phi)
            lo, hi = grid.lo, grid.hi
            # counter-clockwise in (psi, phi) (orientation preserving): phi = lo, psi = hi, phi = hi, psi = lo
            sx = np.stack([lo[:, 0], hi[:, 0], hi[:, 0], lo[:, 0]], 1)
            sy = np.stack([lo[:, 1], lo[:, 1], hi[:, 1], hi[:, 1]], 1)
            w0, w1 = hi[:, 0] - lo[:, 0], hi[:, 1] - lo[:, 1]
            z = np.zeros(N)
            dx = np.stack([w0, z, -w0, z], 1)
            dy = np.stack([z, w1, z, -w1], 1)
            self.kind = "tensor"
        else:
            raise NotImplementedError(f"the grid path of V_p supports HealpixGrid and TensorGrid(3, ...), "
                                      f"got {type(grid).__name__}")
        self.sx, self.sy = np.ravel(sx).astype(float), np.ravel(sy).astype(float)
        self.dx, self.dy = np.ravel(dx).astype(float), np.ravel(dy).astype(float)

    def points(self, e, tau, jac=False):
        """X (and dX/dtau) at parameters tau (shape (len(e), q)) of edges e."""
        e = np.asarray(e)
        x = self.sx[e, None] + tau * self.dx[e, None]
        y = self.sy[e, None] + tau * self.dy[e, None]
        if self.kind == "healpix":
            from .grids._healpix_map import face_map, face_map_jacobian

            f = np.broadcast_to(self.face[e, None], x.shape)
            if not jac:
                return face_map(f, x, y)
            X, Xx, Xy = face_map_jacobian(f, x, y)
            return X, Xx * self.dx[e, None, None] + Xy * self.dy[e, None, None]
        sp_, cp_, sf, cf = np.sin(x), np.cos(x), np.sin(y), np.cos(y)
        X = np.stack([sp_ * cf, sp_ * sf, cp_], -1)
        if not jac:
            return X
        Xpsi = np.stack([cp_ * cf, cp_ * sf, -sp_], -1)
        Xphi = np.stack([-sp_ * sf, sp_ * cf, np.zeros_like(x)], -1)
        return X, Xpsi * self.dx[e, None, None] + Xphi * self.dy[e, None, None]


def _edges_of(grid) -> _Edges:
    d = _vp_cache_for(grid)
    if "edges" not in d:
        d["edges"] = _Edges(grid)
    return d["edges"]


def _dot3(X, a) -> np.ndarray:
    """<X, a> over the last axis (length 3), element by element: the same bits for a point whatever else is in
    the array (a BLAS product sums the rows of a block and its remainder in different orders)."""
    return X[..., 0] * a[0] + X[..., 1] * a[1] + X[..., 2] * a[2]


def _wsum(v, w) -> np.ndarray:
    """sum_j v[..., j] w[j] in the order of j, element by element (as :func:`_dot3`: a quadrature sum that does
    not depend on which other edges share the batch, so a cell's V_p average is the same bits on every grid)."""
    acc = v[..., 0] * w[0]
    for j in range(1, len(w)):
        acc = acc + v[..., j] * w[j]
    return acc


def _axial_cell_integrals(grid, a, H, chunk: int = 16384):
    """int_{C_i} phi(<a, x>) dA for every cell, where H(u, s) = H(u) - s H(1) for the antiderivative H of
    phi with H(0) = 0 (s in {-1, 0, 1}; s = +-1 is only asked for u of that sign) and phi is smooth except
    at u = 0 (a branch point of H) and u = +-1. Returns (integrals, meets): ``meets`` flags the cells
    whose boundary meets u = 0."""
    ed = _edges_of(grid)
    N = grid.n_cells
    nE = 4 * N
    a = np.asarray(a, float)
    ts = np.linspace(0.0, 1.0, _N_SAMPLE + 1)
    u = np.empty((nE, _N_SAMPLE + 1))
    ell = np.empty((nE, _N_SAMPLE))  # chord lengths of the sub-intervals
    for s0 in range(0, nE, 4 * chunk):
        e = np.arange(s0, min(s0 + 4 * chunk, nE))
        X = ed.points(e, np.broadcast_to(ts, (len(e), len(ts))))
        u[e] = _dot3(X, a)
        ell[e] = np.linalg.norm(np.diff(X, axis=1), axis=2)
    u[np.abs(u) < _U_ZERO] = 0.0
    cu = u.reshape(N, -1)
    meets = (cu.min(axis=1) <= 0.0) & (cu.max(axis=1) >= 0.0)
    side = np.where(meets, 0.0, np.sign(_dot3(grid.centers, a)))
    s_edge = np.repeat(side, 4)
    # Sub-intervals that pass within _NEAR edge lengths of a branch point of the integrand: the circle
    # u = 0 (where H ~ |u|^{1-2p}) or a pole u = +-1 (where 1 - u^2 -> 0). Plain Gauss loses accuracy there
    # (an edge passing at distance d puts a complex singularity at distance ~d from it), so these are
    # split at the crossing (sign change of u: bisection) or at the closest approach (golden section)
    # and integrated on subintervals graded geometrically towards that point.
    ua, ub = u[:, :-1], u[:, 1:]
    on_circle = (ua == 0) & (ub == 0)  # on u = 0 throughout: the integrand is 0 there
    reach = _NEAR * ell.sum(axis=1, keepdims=True)
    near0 = (np.minimum(np.abs(ua), np.abs(ub)) < reach) & ~on_circle
    ra = np.sqrt(np.maximum(2.0 - 2.0 * np.abs(ua), 0.0))
    rb = np.sqrt(np.maximum(2.0 - 2.0 * np.abs(ub), 0.0))
    near_pole = (np.minimum(ra, rb) < reach) & ~near0
    flagged = (near0 | near_pole).any(axis=1)
    out = np.zeros(N)

    def integrand(e, tau, s):
        X, dX = ed.points(e, tau, jac=True)
        uu = _dot3(X, a)
        uu = np.where(np.abs(uu) < _U_ZERO, 0.0, uu)
        one_m = (1.0 - uu) * (1.0 + uu)
        num = _dot3(np.cross(dX, X), a)
        with np.errstate(divide="ignore", invalid="ignore"):
            val = H(uu, s[:, None]) * num / one_m
        return np.where(one_m > 0, val, 0.0)

    def u_at(e, tau):
        return _dot3(ed.points(e, tau[:, None]), a)[:, 0]

    # plain edges: one Gauss rule per edge
    g16, w16 = _gauss01(_N_PLAIN)
    plain = np.flatnonzero(~flagged)
    for s0 in range(0, len(plain), 4 * chunk):
        e = plain[s0:s0 + 4 * chunk]
        v = _wsum(integrand(e, np.broadcast_to(g16, (len(e), _N_PLAIN)), s_edge[e]), w16)
        np.add.at(out, e // 4, v)
    fe = np.flatnonzero(flagged)
    if len(fe) == 0:
        return out, meets
    j_e, j_i = np.nonzero(np.ones((len(fe), _N_SAMPLE), bool))
    e_all = fe[j_e]
    lo, hi = ts[j_i], ts[j_i + 1]
    ulo, uhi = u[e_all, j_i], u[e_all, j_i + 1]
    n0, npl = near0[e_all, j_i], near_pole[e_all, j_i]
    point = np.full(len(lo), np.nan)  # the singular point of a near sub-interval
    # crossings: bisection
    ch = n0 & (ulo * uhi < 0)
    r_lo, r_hi, e_ch, s_lo = lo[ch].copy(), hi[ch].copy(), e_all[ch], np.sign(ulo[ch])
    for _ in range(55):
        mid = 0.5 * (r_lo + r_hi)
        left = np.sign(u_at(e_ch, mid)) == s_lo
        r_lo, r_hi = np.where(left, mid, r_lo), np.where(left, r_hi, mid)
    point[ch] = 0.5 * (r_lo + r_hi)
    # closest approach (min |u| near the circle, max |u| near a pole): golden section
    gs_ = (n0 & ~ch) | npl
    sgn = np.where(npl, -1.0, 1.0)[gs_]
    g_lo, g_hi, e_g = lo[gs_].copy(), hi[gs_].copy(), e_all[gs_]
    phi_g = 0.5 * (np.sqrt(5.0) - 1.0)
    for _ in range(60):
        m1 = g_hi - phi_g * (g_hi - g_lo)
        m2 = g_lo + phi_g * (g_hi - g_lo)
        first = sgn * np.abs(u_at(e_g, m1)) <= sgn * np.abs(u_at(e_g, m2))
        g_hi, g_lo = np.where(first, m2, g_hi), np.where(first, g_lo, m1)
    tc = 0.5 * (g_lo + g_hi)
    # an end sample is better than the bracket's interior when the extremum is at the end (u = 0 there)
    span = hi[gs_] - lo[gs_]
    tc = np.where(tc - lo[gs_] < 1e-9 * span, lo[gs_], np.where(hi[gs_] - tc < 1e-9 * span, hi[gs_], tc))
    point[gs_] = tc
    near = ch | gs_
    # pieces (edge, singular point, other end), graded towards the singular point; the rest plain
    pe, pa, pb = [], [], []
    for end in (lo, hi):
        keep = near & (np.abs(end - point) > 0)
        pe.append(e_all[keep]); pa.append(point[keep]); pb.append(end[keep])
    pe, pa, pb = (np.concatenate(v) for v in (pe, pa, pb))
    rest = ~near
    lev = _GRADE ** np.arange(_LEVELS + 1)
    f0 = np.concatenate([lev[1:], [0.0]])
    L = pb - pa
    sub_e = np.concatenate([np.repeat(pe, len(f0)), e_all[rest]])
    sub_a = np.concatenate([(pa[:, None] + L[:, None] * f0[None, :]).ravel(), lo[rest]])
    sub_b = np.concatenate([(pa[:, None] + L[:, None] * lev[None, :]).ravel(), hi[rest]])
    gs, ws = _gauss01(_N_SUB)
    for s0 in range(0, len(sub_e), 4 * chunk):
        sl = slice(s0, s0 + 4 * chunk)
        e, aa, bb = sub_e[sl], sub_a[sl], sub_b[sl]
        tau = aa[:, None] + (bb - aa)[:, None] * gs[None, :]
        v = _wsum(integrand(e, tau, s_edge[e]), ws) * np.abs(bb - aa)
        np.add.at(out, e // 4, v)
    return out, meets


def _vp_profile(k: int, p: float):
    from scipy.special import beta as beta_fn, betainc

    al, be = (0.5 - p, 1.0 + p) if k == 1 else (0.5 + p, 1.0 - p)
    H1 = 0.5 * beta_fn(al, be)

    def H(u, s):
        u2 = u * u
        # s = 0: H(u); s = +-1 (sign(u) = s): H(u) - s H(1) = -s H(1) I_{1-u^2}(be, al)
        return np.where(s == 0, np.sign(u) * H1 * betainc(al, be, u2),
                        -s * H1 * betainc(be, al, np.clip((1.0 - u) * (1.0 + u), 0.0, 1.0)))

    return H


def vp_cell_averages(grid, E, p: float) -> np.ndarray:
    r"""Cell averages (1/|C_i|) int_{C_i} |(I - P_E) x|^{2p} / |P_E x|^{2p} dA of the V_p weight.

    Exact up to quadrature round-off for every cell, including the cells on E^perp where the weight is
    singular (integrable iff 2p < dim E): the area integral is turned into integrals along the cells'
    exact (curved) edges by the divergence theorem, with the weight's antiderivative in closed form
    (incomplete beta), and the edges that meet E^perp are integrated with quadrature graded towards the
    crossing (see the comment block above in ``spectral.py``). Measured (tests/test_spectral.py):
    uniform density, sum_i |C_i| avg_i / (4 pi) = B(1/2 - p, 1 + p) / 2 to 1e-11 relative.

    Parameters
    ----------
    grid : HealpixGrid or TensorGrid(3, ...)
    E : (k, 3) array_like, orthonormal rows.
    p : float in (0, 1].

    Returns
    -------
    (N,) ndarray, cached per (grid, E, p). ``inf`` for cells that meet the singular set when 2p >= k.
    """
    p = finite_float(p, "p", low=0.0, high=1.0, low_open=True)
    Eb = as_basis(E, 3)
    k = Eb.shape[0]
    key = (Eb.tobytes(), p)
    cache = _vp_cache_for(grid)
    if key in cache:
        return cache[key]
    N = grid.n_cells
    if k == 3:
        avg = np.zeros(N)
    else:
        a = Eb[0] if k == 1 else np.cross(Eb[0], Eb[1])
        if 2 * p >= k:
            # infinite where a cell meets the singular set; elsewhere the weight is bounded: plain quadrature
            if k == 1:
                _, meets = _axial_cell_integrals(grid, a, lambda uu, s: uu)
            else:
                meets = np.zeros(N, bool)
                meets[np.unique(grid.cell_of(np.stack([a, -a])))] = True
            Pm = Eb.T @ Eb

            def wfun(x):
                px = x @ Pm
                pe2 = np.maximum(np.einsum("ij,ij->i", px, px), 1e-300)
                return (np.maximum(1.0 - pe2, 0.0) / pe2) ** p
            avg = np.full(N, np.inf)
            ok = np.flatnonzero(~meets)
            if len(ok):
                full = grid.cell_average(wfun, order=8)
                avg[ok] = full[ok]
        elif type(grid).__name__ == "AdaptiveHealpixGrid":  # each cell once across an adaptive run's grids
            avg = _adaptive_cell_averages(grid, key, a, _vp_profile(k, p))
        else:
            integ, _ = _axial_cell_integrals(grid, a, _vp_profile(k, p))
            avg = integ / grid.areas
    avg.setflags(write=False)
    cache[key] = avg
    return avg
