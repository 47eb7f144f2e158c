"""Spectral objects of (B, V), the projection Pi, the limit measure Pi#rho and the Lyapunov functional V_p.

Functions
---------
spectral_data(B, V, tol=1e-8)
    A = V B^T, mu_1, mu_2, gamma, E, P_E, F, F_abs, sigma_max(B) and the status of Assumption 1.
projection(x, E)
    Pi(x) = P_E x / |P_E x|.
limit_measure(points, weights, B, V)
    (points, weights) of Pi#rho for the measure rho = sum_i w_i delta_{x_i}.
lyapunov_vp(points, weights, E, p)
    V_p(rho) = int |(I - P_E) x|^{2p} / |P_E x|^{2p} d rho.

Subspace bases are (k, d) arrays with orthonormal **rows** (a (d,) vector is read as k = 1), so that
P_E x = (x @ E.T) @ E for points stored as rows. Conventions: score <x, B y>, value V y, A = V B^T.
A grid density enters as ``(grid.centers, f * grid.areas)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._checks import as_matrix, finite_float

__all__ = ["SpectralData", "spectral_data", "projection", "limit_measure", "lyapunov_vp", "as_basis",
           "PERP_TOL", "MAX_CONDITION"]

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
    x = np.atleast_2d(np.asarray(points, dtype=float))
    if x.ndim != 2 or (d is not None and x.shape[1] != d):
        raise ValueError(f"points must have shape (n, {d if d else 'd'}), got {np.shape(points)}")
    w = np.asarray(weights, dtype=float).reshape(-1)
    if w.shape != (x.shape[0],):
        raise ValueError(f"weights must have shape ({x.shape[0]},) (one per point), got {np.shape(weights)}")
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


def lyapunov_vp(points, weights, E, p: float, strict: bool = True) -> float:
    r"""V_p(rho) = int |(I - P_E) x|^{2p} / |P_E x|^{2p} d rho(x) for rho = sum_i w_i delta_{x_i}.

    Parameters
    ----------
    points : (n, d) array_like
        Unit rows.
    weights : (n,) array_like
        Masses >= 0.
    E : (k, d) array_like
        Orthonormal basis (rows) of E.
    p : float
        Exponent, 0 < p <= 1.
    strict : bool, default True
        Raise when 2p >= k: V_p is then infinite for every bounded density, so a finite value computed
        from a quadrature (grid centres) or from particles is a discretisation artefact. Pass
        ``strict=False`` to evaluate the sum anyway (meaningful for genuinely atomic measures).

    Returns
    -------
    float
        V_p (``inf`` if some mass lies on E^perp).

    Notes
    -----
    Near E^perp the integrand behaves like dist(x, E^perp)^{-2p} on a set of codimension k, integrable
    iff 2p < k (MODEL.md). For uniform rho on S^2 and k = 1 this means p < 1/2.
    """
    p = finite_float(p, "p", low=0.0, high=1.0, low_open=True)
    Eb = as_basis(E)
    x, w = _check_measure(points, weights, Eb.shape[1])
    k = Eb.shape[0]
    if strict and 2 * p >= k:
        raise ValueError(
            f"V_p is infinite for a bounded density when 2p >= dim E: p = {p:g}, dim E = {k} "
            f"(allowed: p < {k / 2:g}); pass strict=False to sum over atoms anyway"
        )
    c = x @ Eb.T
    pe2 = np.einsum("ij,ij->i", c, c)
    perp2 = np.maximum(np.einsum("ij,ij->i", x, x) - pe2, 0.0)
    pos = w > 0
    if np.any(pos & (pe2 == 0)):
        return np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(pos, (perp2 / np.where(pe2 > 0, pe2, 1.0)) ** p, 0.0)
    return float(np.sum(w * ratio))
