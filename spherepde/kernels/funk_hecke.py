"""Funk-Hecke evaluation of the attention sums with fast spherical-harmonic transforms (ducc0).

For a target with kernel centre u and concentration kappa the shifted sums are the denominator and
the numerator

    D(u, kappa) = sum_j W_j exp(kappa (<u, y_j> - 1)) = sum_l 4 pi e^-kappa i_l(kappa) sum_m a_lm Y_lm(u)
    N(u, kappa) = sum_j W_j y_j exp(kappa (<u, y_j> - 1)) = (N.u) u + grad_u D / kappa

(a_lm of the map W from the adjoint synthesis, so no quadrature error: ducc0's ring transform on HEALPix
pixel centres, exact up to rounding, else its general one at accuracy EPS_SHT). The numerator needs no
maps of its own: its component along u is the sum with the zonal kernel t exp(kappa (t - 1)) (Legendre
coefficients from those of D's kernel), and its tangential part is the surface gradient of D over kappa
(ducc0's spin-1 synthesis of sqrt(l (l + 1)) a_lm: one call for both components, ~1.7 spin-0 calls).

General B gives every target its own kappa, so the kernels' Funk-Hecke factors are approximated by
low-rank expansions sum_k alpha_k(kappa) phi_k(l) (:func:`_bin_basis`): targets are split into bins
[a, b] of kappa; in each bin the kernels' coefficient vectors at Chebyshev points of S equal
sub-intervals (degree p = 8) are compressed into orthonormal bases (SVD, refined in extended precision):
a joint one for D and N.u (r_J spin-0 maps: the two take different coefficients of the same maps) and
one for the gradient (r_G spin-1 maps). The maps G_k(u) = sum_lm phi_k(l) a_lm Y_lm(u) are synthesised
at the bin's targets (ducc0 ``synthesis_general``) and each sum is sum_k alpha_k(kappa) G_k(u), alpha from
the Lagrange weights of the target's sub-interval. At the benchmark's goal (nside 64, beta 100) that is
3 bins of 12 spin-0 and 11 spin-1 maps, ~31 spin-0 equivalents per bin, where the four Cartesian sums
with Chebyshev interpolation over 4 bins took 4 x 13 = 52; and the transform-error term lost the
interpolation's Lebesgue constant. Each map is added into the sums (weighted by its coefficient at every
target) by the worker that synthesised it, while it is in cache.

Error bound per target (the terms bound sum_j W_j |error of its kernel value|; for the numerator, of its
vector error, so they bound each component):

- kernel approximation (rigorous, per bin, :func:`_bin_basis`): for every kappa in the bin and t in
  [-1, 1], D's kernel within ib + lam (tail + res_D), N.u's within ib + lam (tailB + res_N), and
  sqrt(1 - t^2) |d/dt| of the gradient's within L (ib + lam (tail + res_G) + tail) + dtail (Bernstein's
  inequality: |grad_u sum_j W_j E(<u, y_j>)| <= sum_j W_j |E'| sqrt(1 - t^2)), over kappa. ib: the
  interpolation error in kappa on a sub-interval: for fixed s = 1 - t in [0, 2], kappa -> exp(-kappa s) is
  entire and bounded by exp(s (hw (rho + 1/rho) / 2 - c)) on the Bernstein ellipse E_rho of [a, b] (centre
  c, half-width hw), so the degree-p Chebyshev interpolant is off by <= 4 M rho^-p / (rho - 1) (Trefethen,
  ATAP Thm 8.2; the same for t exp(-kappa s), |t| <= 1); :func:`interp_bound` takes the best rho for every
  s (monotonicity in s makes a grid in s rigorous). lam: the Lebesgue constant of degree p. The tails: the
  truncation at degree L. res: the largest residual of the node vectors after the compression, as a
  polynomial in t (sup over a grid with Bernstein's inequality), computed in extended precision with the
  float64 basis and coefficients that are used. Times ||W||_1.
- rounding (a posteriori): 4 (r + 2p + 10) eps sum_k ab_k |G_k|, ab_k = sum_j |l_j| |beta_jk| >= |alpha_k|
  (the products, their sums over k and over the workers, and the coefficients themselves), and 8 eps of
  the numerator's parts for its assembly.
- transform error (a model, as the rounding model of the in-house path): ducc0 is asked for EPS_SHT;
  the error of a map is taken as NUFFT_SAFETY * EPS_SHT * (rms of that map over the sphere, from
  Parseval; for a spin-1 map the rms of the vector), times ab_k, summed over k. Measured: <= 0.5 EPS_SHT
  rms for Chebyshev node maps (concentrated densities; 0.08 for smooth ones) at kappa 10..176, <= 0.15
  for the spin-0 and <= 0.21 for the spin-1 basis maps (tests), so the model has a margin of 20 or more.

Functions
---------
available()
    Whether ducc0 is importable.
interp_bound(a, b, n)
    Rigorous bound of the kernel interpolation error on [a, b] at degree n.
plan(kappa_sorted, goal, lmax_cap)
    Bins, degrees and basis ranks.
spectral_sums(U, kappa, Y, W, bins, order, nthreads, cache=None)
    The four sums and the per-target error bound.
healpix_ring_nside(Y)
    nside if Y are the HEALPix pixel centres in RING order, else 0.
"""
from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np

from .attention import sph_tail

try:  # optional at import time; pyproject lists it as a dependency
    import ducc0
except ImportError:  # pragma: no cover
    ducc0 = None

__all__ = ["available", "healpix_ring_nside", "interp_bound", "plan", "spectral_sums", "EPS_SHT",
           "NUFFT_SAFETY"]

#: Accuracy asked of ducc0's transforms (its floor for float64 is 2e-13).
EPS_SHT = 3e-13
#: Margin of the transform error model over the largest measured error (see the module notes).
NUFFT_SAFETY = 10.0
#: Fixed groups of basis maps per bin, each summed by one task (see :func:`spectral_sums`): the result
#: is the same for any thread count.
SUM_GROUPS = 4
EPS = float(np.finfo(float).eps)
#: Most bins, and most Chebyshev nodes of a bin for the planning estimate (:func:`_nodes_needed`).
MAX_BINS = 8
NMAX = 40
#: Chebyshev degree in kappa on the sub-intervals of a bin, and most sub-intervals (<= 576 node columns).
P_SUB = 8
SUB_MAX = 64
#: Cost model: CPU seconds of one basis-map synthesis of degree L at m targets, T_CALL + T_LL L^2 +
#: T_POINT m + T_POINT2 m^2, fitted to syntheses run as spectral_sums runs them (two side by side, with the
#: accumulation) on the 2-core AVX2 machine at L 52..140, m 3000..49152 (within 15%). The m^2 term: one call
#: costs 4.4 ms at m = 49152 alone, 8-9 ms next to another (memory traffic of the interpolation).
T_CALL = 4.5e-4
T_LL = 1.27e-7
T_POINT = 4.6e-8
T_POINT2 = 2.04e-12
#: A spin-1 synthesis (two maps, one interpolation) costs this many spin-0 ones (measured at L 104).
SPIN1_COST = 1.7


def available() -> bool:
    return ducc0 is not None


def lebesgue(n: int) -> float:
    """Bound of the Lebesgue constant of n + 1 Chebyshev points of the second kind (ATAP Thm 15.2)."""
    return 2.0 / math.pi * math.log(n + 1.0) + 1.0


def nodes(a: float, b: float, n: int) -> np.ndarray:
    """n + 1 Chebyshev points of the second kind on [a, b] (n = 0: the midpoint)."""
    if n == 0:
        return np.array([0.5 * (a + b)])
    return 0.5 * (a + b) + 0.5 * (b - a) * np.cos(np.pi * np.arange(n + 1) / n)


# any rho > 1 gives a valid bound (a grid only restricts the choice); the s grid is made rigorous by
# monotonicity on each cell
_S = np.linspace(0.0, 2.0, 257)
_RHO = np.exp(np.linspace(0.005, 8.0, 160))[:, None]
_LOGRHO = np.log(_RHO)
_LOGRM1 = np.log(_RHO - 1.0)


def interp_bound(a: float, b: float, n: int) -> float:
    """max over s in [0, 2] and kappa in [a, b] of |exp(-kappa s) - p_n(kappa)|, p_n the interpolant in
    n + 1 Chebyshev points of the second kind of [a, b]: an upper bound (rigorous; see module notes)."""
    c = 0.5 * (a + b)
    hw = 0.5 * (b - a)
    if hw <= 0.0:
        return 0.0
    if n == 0:
        # the midpoint value: |exp(-kappa s) - exp(-c s)| <= hw max_s s exp(-a s) <= hw min(2, 1 / (e a));
        # this is what a conformal B (all kappa equal up to rounding) gets
        return min(1.0, hw * (2.0 if a <= 0.5 / math.e else min(2.0, 1.0 / (math.e * a))))
    half = hw * 0.5 * (_RHO + 1.0 / _RHO) - c  # (hw (rho + 1/rho) / 2 - c): log M / s
    # log M is linear (monotone) in s: its maximum over a cell [s_i, s_i+1] is at an end
    lm = np.maximum(_S[None, :-1] * half, _S[None, 1:] * half)
    logE = math.log(4.0) + lm - n * _LOGRHO - _LOGRM1
    return float(np.exp(logE.min(axis=0).max()))


def _degree(b: float, goal: float, lmax_cap: int) -> int:
    """Smallest L with tail_L(b) <= goal (the tail grows with kappa), or lmax_cap + 1."""
    if b == 0.0:
        return 0
    ext = max(30, int(b) + 30)
    lo, hi = 0, lmax_cap + 1
    if sph_tail(b, lmax_cap, ext) > goal:
        return lmax_cap + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if sph_tail(b, mid, ext) <= goal:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _nodes_needed(a: float, b: float, goal: float) -> int:
    """Smallest n <= NMAX with interp_bound(a, b, n) <= goal (the bound decreases with n for n >= 1), or
    NMAX + 1: the degree Chebyshev interpolation over the whole bin would need, which the planning uses to
    estimate the rank of the bin's basis before building it. n = 0 is tried first: its bound has its own
    formula (not on the rho grid of n >= 1), and it is the one that meets the goal for a conformal B (an
    interval of rounding width)."""
    if interp_bound(a, b, 0) <= goal:
        return 0
    if interp_bound(a, b, NMAX) > goal:
        return NMAX + 1
    lo, hi = 1, NMAX
    while lo < hi:
        mid = (lo + hi) // 2
        if interp_bound(a, b, mid) <= goal:
            hi = mid
        else:
            lo = mid + 1
    return lo


@functools.lru_cache(maxsize=256)
def _bin_degree(b: float, goal: float, lmax_cap: int) -> int:
    """Least degree L (or lmax_cap + 1) whose truncation tails at kappa = b (the largest: tails grow with
    kappa) are <= goal / 4: the tail of exp(kappa (t - 1)) and the bound A_L + tail of t exp(kappa (t - 1))
    (:func:`_kernel_columns`; A_L dominates at small kappa, where the coefficients fall fastest).

    Cached: a pure function of its arguments, asked again at every plan (one per bin of every split tried),
    with the same b whenever kappa's range is the same (an orthogonal B: kappa = beta at every target). Its
    extended-precision recurrences were 11 % of an adaptive run's late phase (beta 100, 17k cells, a plan at
    every regrid), where every evaluator choice plans the fast transforms again for the new cell count."""
    L = _degree(b, goal / 12.0, lmax_cap)
    while L <= lmax_cap:
        A, B, tail, tailB, dtail = _kernel_columns([b], L)
        if float(tailB[0]) <= goal / 4.0:
            return L
        L += 1
    return L


def _call_cost(r0, r1, L, m):
    """CPU seconds of r0 spin-0 and r1 spin-1 syntheses of degree L at m targets."""
    return (r0 + SPIN1_COST * r1) * (T_CALL + T_LL * L * L + T_POINT * m + T_POINT2 * m * m)


def plan(kappa_sorted: np.ndarray, goal: float, lmax_cap: int, cost_cap: float = math.inf):
    """Split the (sorted) kappa range into bins; returns (cost, [(i0, i1, a, b, L, r, g), ...]) with the
    cheapest number of geometric bins (1..MAX_BINS) by the cost model, or (inf, None) if no plan meets
    the goal within lmax_cap (and NMAX, SUB_MAX): targets i0:i1 of the sorted ones, kappa in [a, b],
    degree L, r = (spin-0, spin-1) basis map counts (:func:`_bin_basis`, kernel goal g = goal / 3).

    Every split is first costed with the ranks estimated from the Chebyshev degree n over each bin
    (n spin-0 and n - 1 spin-1 maps at the benchmark's goal); the bases are built (and cached) for the
    three cheapest only, and the cheapest by their true ranks is returned. Splits estimated above
    1.5 ``cost_cap`` are not built: (inf, None) if that leaves none (the caller has a cheaper method)."""
    M = kappa_sorted.shape[0]
    kmin, kmax = float(kappa_sorted[0]), float(kappa_sorted[-1])
    if _bin_degree(kmax, goal / 3.0, lmax_cap) > lmax_cap:  # the top bin's degree, whatever the split
        return (math.inf, None)
    cands = []
    for J in range(1, MAX_BINS + 1):
        if J == 1 or kmin <= 0.0:
            edges = np.linspace(kmin, kmax, J + 1)
        else:
            edges = np.geomspace(kmin, kmax, J + 1)
        edges[0], edges[-1] = kmin, kmax
        bins = []
        est = 0.0
        ok = True
        for q in range(J):
            a, b = float(edges[q]), float(edges[q + 1])
            i0 = int(np.searchsorted(kappa_sorted, a, "left")) if q > 0 else 0
            i1 = int(np.searchsorted(kappa_sorted, b, "right")) if q < J - 1 else M
            if i1 <= i0:
                continue
            a, b = float(kappa_sorted[i0]), float(kappa_sorted[i1 - 1])
            L = _bin_degree(b, goal / 3.0, lmax_cap)
            n = _nodes_needed(a, b, goal / 3.0)
            if L > lmax_cap or n > NMAX:
                ok = False
                break
            bins.append((i0, i1, a, b, L))
            est += _call_cost(max(1, n), max(1, n - 1), L, i1 - i0)
        if ok and est <= 1.5 * cost_cap:
            cands.append((est, J, bins))
    best = (math.inf, None)
    for est, J, bins in sorted(cands)[:3]:
        final = []
        cost = 0.0
        for (i0, i1, a, b, L) in bins:
            basis = _bin_basis(a, b, L, goal / 3.0)
            if basis is None:
                break
            r = (basis.phiJ.shape[1], basis.phiG.shape[1])
            final.append((i0, i1, a, b, L, r, goal / 3.0))
            cost += _call_cost(r[0], r[1], L, i1 - i0)
        else:
            if cost < best[0]:
                best = (cost, final)
    return best


def _loc(P):
    """(theta, phi) of unit vectors (rows)."""
    th = np.arccos(np.clip(P[:, 2], -1.0, 1.0))
    ph = np.mod(np.arctan2(P[:, 1], P[:, 0]), 2.0 * np.pi)
    return np.ascontiguousarray(np.stack([th, ph], axis=1))


@numba.njit(parallel=True, cache=True)
def _coefficients(kb, edges, kn, bw, beta, alpha, ab):
    """Per target kappa kb[i]: its sub-interval s (edges[s] <= kappa <= edges[s + 1]; the nearest one where
    rounding puts kappa outside all), the barycentric (second kind) Lagrange weights l_j of that
    sub-interval's nodes kn[s] (a kappa on a node takes that node's value) and the basis coefficients
    alpha[k, i] = sum_j l_j beta[s, j, k], with ab[k, i] = sum_j |l_j| |beta[s, j, k]| >= |alpha[k, i]|."""
    S = kn.shape[0]
    p1 = kn.shape[1]
    r = beta.shape[2]
    M = kb.shape[0]
    for c in numba.prange((M + 255) // 256):
        lj = np.empty(p1)
        for i in range(c * 256, min(M, c * 256 + 256)):
            kap = kb[i]
            lo = 0
            hi = S - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if kap >= edges[mid]:
                    lo = mid
                else:
                    hi = mid - 1
            s = lo
            hit = -1
            for j in range(p1):
                if kap == kn[s, j]:
                    hit = j
                    break
            if hit >= 0:
                for j in range(p1):
                    lj[j] = 0.0
                lj[hit] = 1.0
            else:
                tsum = 0.0
                for j in range(p1):
                    t = bw[j] / (kap - kn[s, j])
                    lj[j] = t
                    tsum += t
                rs = 1.0 / tsum
                for j in range(p1):
                    lj[j] *= rs
            for k in range(r):
                v = 0.0
                va = 0.0
                for j in range(p1):
                    v += lj[j] * beta[s, j, k]
                    va += abs(lj[j]) * abs(beta[s, j, k])
                alpha[k, i] = v
                ab[k, i] = va


@numba.njit(nogil=True, cache=True)
def _accumulate0(aD, bD, aN, bN, g, acc):
    """One spin-0 basis map g into the sums of D (acc[0]) and N.u (acc[1]) and their a posteriori rounding
    sums (acc[4], acc[5]; b >= |a|); runs in the worker that synthesised g, while g is in cache."""
    for i in range(g.shape[0]):
        gi = g[i]
        acc[0, i] += aD[i] * gi
        acc[1, i] += aN[i] * gi
        acc[4, i] += bD[i] * abs(gi)
        acc[5, i] += bN[i] * abs(gi)


@numba.njit(nogil=True, cache=True)
def _accumulate1(aG, bG, g, acc):
    """One spin-1 basis map g (its d/dtheta and d/dphi / sin theta rows) into the gradient sums (acc[2],
    acc[3]) and their rounding sum (acc[6])."""
    for i in range(g.shape[1]):
        acc[2, i] += aG[i] * g[0, i]
        acc[3, i] += aG[i] * g[1, i]
        acc[6, i] += bG[i] * (abs(g[0, i]) + abs(g[1, i]))


def healpix_ring_nside(Y, tol=1e-15):
    """nside if the rows of Y are the HEALPix pixel centres in RING order (to ``tol``), else 0.

    The ring transforms then use the exact centres: a source off by tol moves its a_lm by ~l tol relative
    (<= 1e-13 at l <= 100, below the transform accuracy EPS_SHT); renormalising a centre moves it by ~1e-16.
    """
    N = Y.shape[0]
    ns = int(round(math.sqrt(N / 12.0)))
    if ns < 1 or 12 * ns * ns != N or Y.shape[1] != 3:
        return 0
    ref = _ring_centres(ns)
    return ns if float(np.max(np.abs(Y - ref))) <= tol else 0


@functools.lru_cache(maxsize=2)  # 24 N bytes each
def _ring_centres(nside):
    import healpy as hp

    c = np.array(hp.pix2vec(nside, np.arange(12 * nside * nside))).T
    c.setflags(write=False)
    return c


def _source_moments(Y, W, Lmax, nthreads):
    """a_lm = sum_j W_j conj(Y_lm(y_j)) of the map W (the numerators' maps W y are not needed: the
    numerator is D's gradient and the kernel t exp(kappa (t - 1)), see :func:`_bin_basis`).

    On the HEALPix pixel centres (RING order) this is ducc0's ring adjoint synthesis (exact up to
    rounding: the centres lie on iso-latitude rings with equispaced longitudes); elsewhere the
    general (NUFFT) one at accuracy EPS_SHT."""
    ns = healpix_ring_nside(Y)
    if ns:
        adjoint, where = ducc0.sht.adjoint_synthesis, _healpix_geometry(ns)
    else:
        # one thread: the NUFFT's parallel spreading adds the threads' grids in an order that depends
        # on the thread count (1 vs 2 threads differed in the last bits); one thread makes it reproducible
        adjoint, where = ducc0.sht.adjoint_synthesis_general, {"loc": _loc(Y), "epsilon": EPS_SHT}
        nthreads = 1
    return adjoint(map=np.ascontiguousarray(W, dtype=float)[None, :], spin=0, lmax=Lmax, nthreads=nthreads,
                   **where)[0]


@functools.lru_cache(maxsize=4)
def _healpix_geometry(nside):
    return ducc0.healpix.Healpix_Base(nside, "RING").sht_info()


def _bessel_columns(ks, L):
    """(L + 1, n) extended-precision (np.longdouble) matrix A[l, i] = (2l + 1) exp(-k_i) i_l(k_i): the
    Legendre coefficients of the kernel exp(k_i (t - 1)) = sum_l A[l, i] P_l(t) truncated at degree L.
    Miller's backward recurrence from degree L + max(30, k + 30) (as :func:`sph_tail`), normalised by
    exp(-k) i_0(k) = -expm1(-2k) / (2k); k = 0 gives P_0. Extended precision keeps the rounding of the
    basis construction (:func:`_bin_basis`) far below the bounds it certifies."""
    ld = np.longdouble
    k = np.asarray(ks, dtype=ld)
    out = np.zeros((L + 1, k.size), dtype=ld)
    pos = k > 0
    out[0, ~pos] = 1.0
    if pos.any():
        kp = k[pos]
        inv = 1.0 / kp
        nxt = np.zeros_like(kp)
        cur = np.ones_like(kp)
        col = np.zeros((L + 1, kp.size), dtype=ld)
        for l in range(L + max(30, int(np.max(ks)) + 30), 0, -1):
            nxt, cur = cur, nxt + (2 * l + 1) * inv * cur  # i_{l-1} from i_{l+1}, i_l
            if l - 1 <= L:
                col[l - 1] = cur
            big = cur > 1e300
            if big.any():  # rescale (longdouble reaches 1e4932; this keeps far from it)
                f = np.where(big, ld(1e-300), ld(1.0))
                nxt, cur, col = nxt * f, cur * f, col * f
        col *= (-np.expm1(-2.0 * kp) / (2.0 * kp)) / col[0]
        out[:, pos] = col
    return out * (2.0 * np.arange(L + 1, dtype=ld) + 1.0)[:, None]


@functools.lru_cache(maxsize=4)
def _legendre_grid(L):
    """P_l(t_k) (m, L + 1) at the m = 8 (L + 1) Chebyshev points t_k = cos((k + 1/2) pi / m), and the
    factor c = 1 / (1 - pi L / (2 m)) with max_[-1, 1] |p| <= c max_k |p(t_k)| for every polynomial p of
    degree <= L (Bernstein: |d/dtheta p(cos theta)| <= L max |p|, and every theta in [0, pi] is within
    pi / (2 m) of a grid angle)."""
    m = 8 * (L + 1)
    t = np.cos((np.arange(m) + 0.5) * np.pi / m)
    P = np.empty((m, L + 1))
    P[:, 0] = 1.0
    if L >= 1:
        P[:, 1] = t
    for l in range(1, L):
        P[:, l + 1] = ((2 * l + 1) * t * P[:, l] - l * P[:, l - 1]) / (l + 1)
    return P, 1.0 / (1.0 - np.pi * L / (2.0 * m))


def _kernel_columns(ks, L):
    """Extended-precision Legendre coefficients (L + 1, n) of the kernels exp(k (t - 1)) (A) and
    t exp(k (t - 1)) (B, from A by t P_l = ((l + 1) P_l+1 + l P_l-1) / (2l + 1)), and per column the bounds
    sum_l>L A_l (= 1 - sum_l<=L A_l: the kernel is 1 at t = 1), sum_l>L |B_l| <= A_L + that, and
    sum_l>L l A_l <= 2 / (L + 2) (k - sum_l<=L l (l + 1) / 2 A_l) (the kernel's slope at t = 1 is k,
    P_l'(1) = l (l + 1) / 2)."""
    ld = np.longdouble
    Af = _bessel_columns(ks, L + 1)
    A = Af[:L + 1]
    l = np.arange(L + 1, dtype=ld)[:, None]
    B = (l + 1) / (2 * l + 3) * Af[1:L + 2]
    B[1:] += (l[1:] / (2 * l[1:] - 1)) * Af[:L]
    tail = np.maximum(1.0 - A.sum(axis=0), 0.0)
    dtail = 2.0 / (L + 2) * np.maximum(np.asarray(ks, dtype=ld) - (l * (l + 1) / 2 * A).sum(axis=0), 0.0)
    # (extended rounding of these differences: ~1e-19 (1 + k), covered by the margins below)
    tail = tail + ld(1e-18)
    dtail = dtail + ld(1e-18) * (1 + np.asarray(ks, dtype=ld))
    return A, B, tail, A[L] + tail, dtail


def _compress(C, target, L, rmin=1):
    """An orthonormal basis Psi (L + 1, r) float64 of the columns C (extended precision) and their
    coefficients beta = Psi^T C (extended precision, rounded once), with the least r whose residual
    sup (:func:`_residual_sup`) is <= target: leading left singular vectors (float64 SVD), orthonormalised
    in extended precision, then pivoted Gram-Schmidt on the extended-precision residual (the float64 SVD
    alone leaves ~eps ||C||_2, its backward error: 2e-15 at kappa ~10). At most 6 vectors beyond the count
    of singular values above the target are tried (None beyond: a target at the float64 floor, ~eps/2).
    Returns (Psi, beta, R) with R the exact residual C - Psi beta of the float64 Psi and beta."""
    Psi, sv, _ = np.linalg.svd(C.astype(float), full_matrices=False)
    r0 = max(rmin, int(np.searchsorted(-sv, -target)) - 1)
    rmax = min(L + 1, C.shape[1], r0 + 7)
    r0 = min(r0, rmax)
    Q = np.zeros((L + 1, 0), dtype=np.longdouble)
    R = C.copy()

    def add(q):
        nonlocal Q, R
        for _ in range(2):
            q = q - Q @ (Q.T @ q)
            q = q / np.sqrt(q @ q)
        Q = np.concatenate([Q, q[:, None]], axis=1)
        R = R - np.outer(q, q @ R)

    for k in range(r0):
        add(Psi[:, k].astype(np.longdouble))
    while True:
        if Q.shape[1] >= rmax or _residual_sup(R, L, target) <= target:
            Pr = Q.astype(float)
            Pl = Pr.astype(np.longdouble)
            beta = (Pl.T @ C).astype(float)
            Rf = C - Pl @ beta.astype(np.longdouble)
            if _residual_sup(Rf, L, target) <= target:
                return Pr, beta, Rf
            if Q.shape[1] >= rmax:
                return None
        nr = (R * R).sum(axis=0)
        add(R[:, int(np.argmax(nr))].copy())


def _residual_sup(R, L, target=None):
    """An upper bound of max over the columns of sup_t |sum_l R_l P_l(t)|, exact enough where it matters:
    a column whose l1 norm (>= its sup) is below the target is not evaluated; if a column's L2 norm on
    [-1, 1] over sqrt 2 (<= its sup) is above it, that lower bound is returned (it fails either way); the
    rest on the grid of :func:`_legendre_grid` (+ the rounding of that float64 evaluation)."""
    Rf = R.astype(float)
    l1 = np.abs(Rf).sum(axis=0)
    if target is None:  # the tightest: every column on the grid
        target = 0.0
    lo = np.sqrt((Rf ** 2 / (2.0 * np.arange(L + 1) + 1.0)[:, None]).sum(axis=0))
    if target > 0.0 and lo.max() > target:
        return float(lo.max())
    todo = l1 > target
    if not todo.any():
        return float(l1.max())
    P, c = _legendre_grid(L)
    grid = c * np.abs(P @ Rf[:, todo]).max(axis=0) + 4.0 * (L + 2) * EPS * l1[todo]
    return float(max(grid.max(), l1[~todo].max() if (~todo).any() else 0.0))


class _Basis(NamedTuple):
    """A bin's bases (:func:`_bin_basis`)."""

    edges: np.ndarray  # (S + 1,) sub-interval edges
    kn: np.ndarray  # (S, p + 1) Chebyshev nodes of the sub-intervals
    bw: np.ndarray  # (p + 1,) barycentric weights
    p: int
    phiJ: np.ndarray  # (L + 1, r_J) joint spin-0 basis (D, N.u) as Funk-Hecke factors
    betaD: np.ndarray  # (S, p + 1, r_J) D's coefficients at the nodes
    betaN: np.ndarray  # (S, p + 1, r_J) N.u's
    bound_D: float
    bound_N: float
    phiG: np.ndarray  # (L + 1, r_G) the gradient's spin-1 basis
    betaG: np.ndarray  # (S, p + 1, r_G)
    bound_G: float


@functools.lru_cache(maxsize=64)
def _bin_basis(a, b, L, goal):
    """Basis maps of a bin [a, b] (degree L) meeting the kernel goal, or None.

    Three kernels per target: D's exp(kappa (t - 1)), the numerator's component along the kernel centre
    t exp(kappa (t - 1)) (its Legendre coefficients B from A, :func:`_kernel_columns`), and the tangential
    numerator as the surface gradient of D over kappa (spin-1 syntheses). Their coefficient vectors,
    as functions of kappa, are interpolated on S equal sub-intervals of [a, b] at degree p (P_SUB; p = 0,
    S = 1 when the bin has rounding width) at the Chebyshev nodes kappa_j of each, and the node columns
    are compressed (:func:`_compress`): a joint basis Psi of the A and B columns (the spin-0 maps: D and
    N.u take different coefficients of the same maps) and a basis Phi of the A columns (the gradient
    maps). A target's coefficients are alpha(kappa) = sum_j l_j(kappa) beta_j: r_J spin-0 and r_G spin-1
    maps per bin, where the four Cartesian sums needed 4 (n + 1) spin-0 maps with Chebyshev interpolation
    over the bin. For every kappa in the bin and t in [-1, 1]:

        |exp(kappa (t - 1)) - sum_l (Psi alpha_D(kappa))_l P_l(t)|   <= ib + lam (tail + res_D)   (bound_D)
        |t exp(kappa (t - 1)) - sum_l (Psi alpha_N(kappa))_l P_l(t)| <= ib + lam (tailB + res_N) (bound_N)
        sqrt(1 - t^2) |d/dt [exp(kappa (t - 1)) - sum_l (Phi alpha_G(kappa))_l P_l(t)]|
            <= L (ib + lam (tail + res_G) + tail) + dtail                                  (bound_G)

    with ib = :func:`interp_bound` of a sub-interval (the first: the bound grows as the centre falls; it
    also holds for t exp(-kappa s), |t| <= 1), lam the Lebesgue constant of p, the tails the largest over
    the nodes (they grow with kappa), res the largest sup over t of the node residuals after the
    compression: computed in extended precision with the float64 basis and coefficients that are used,
    as polynomials in t on a grid (:func:`_legendre_grid`). bound_G: Bernstein's inequality for the
    degree-L polynomial part, sum_l>L l A_l for the tail. S makes ib <= goal / 30; the ranks are the least
    with bound_D, bound_N <= (1 + lam) goal (the budget of Chebyshev interpolation over the bin: the
    truncation's slack below goal goes to the residual), and res_G <= res target of D.

    Returns a :class:`_Basis`: the sub-intervals and their nodes, phiJ and phiG the bases as Funk-Hecke
    factors (4 pi / (2l + 1) Psi: a map is sum_lm phi_lk a_lm Y_lm), beta* their coefficients at the
    nodes, and the three bounds."""
    if b - a == 0.0 or interp_bound(a, b, 0) <= goal / 30.0:
        p, S, ib = 0, 1, interp_bound(a, b, 0)
    else:
        p, S = P_SUB, 1
        while S < SUB_MAX and interp_bound(a, a + (b - a) / S, p) > goal / 30.0:
            S *= 2
        ib = interp_bound(a, a + (b - a) / S, p)
        if ib > goal / 30.0:
            return None
    lam = lebesgue(p)
    edges = a + (b - a) * np.arange(S + 1) / S
    edges[-1] = b
    kn = np.array([nodes(edges[q], edges[q + 1], p) for q in range(S)])
    A, B, tails, tailsB, dtails = _kernel_columns(kn.ravel(), L)
    tail, tailB, dtail = float(tails.max()), float(tailsB.max()), float(dtails.max())
    tD = ((1.0 + lam) * goal - ib) / lam - tail
    tN = ((1.0 + lam) * goal - ib) / lam - tailB
    if min(tD, tN) <= 0.0:
        return None
    n = kn.size
    joint = _compress(np.concatenate([A, B], axis=1), min(tD, tN), L, rmin=2 if n > 1 else 1)
    grad = _compress(A, tD, L)
    if joint is None or grad is None:
        return None
    PsiJ, betaJ, RJ = joint
    PsiG, betaG, RG = grad
    resD = _residual_sup(RJ[:, :n], L)
    resN = _residual_sup(RJ[:, n:], L)
    resG = _residual_sup(RG, L)
    bw = (-1.0) ** np.arange(p + 1)
    if p > 0:
        bw[0] *= 0.5
        bw[-1] *= 0.5
    fh = (4.0 * np.pi / (2.0 * np.arange(L + 1) + 1.0))[:, None]
    rJ, rG = PsiJ.shape[1], PsiG.shape[1]
    return _Basis(edges, kn, bw, p,
                  PsiJ * fh, np.ascontiguousarray(betaJ[:, :n].T.reshape(S, p + 1, rJ)),
                  np.ascontiguousarray(betaJ[:, n:].T.reshape(S, p + 1, rJ)),
                  ib + lam * (tail + resD), ib + lam * (tailB + resN),
                  PsiG * fh, np.ascontiguousarray(betaG.T.reshape(S, p + 1, rG)),
                  L * (ib + lam * (tail + resG) + tail) + dtail)


@functools.lru_cache(maxsize=2)  # 8 (r_J + r_G) nalm(Lmax) bytes per bin: 4 MB at nside 64, beta 100
def _plan_data(bins):
    """What a plan's evaluations share: the a_lm layout of its top degree Lmax (l of each entry, the
    Parseval multiplicity, mstart) and per bin the Funk-Hecke factors of its spin-0 maps and of its
    spin-1 (gradient: times sqrt(l (l + 1))) maps, expanded to that layout."""
    Lmax = max(b[4] for b in bins)
    lidx = np.concatenate([np.arange(m, Lmax + 1) for m in range(Lmax + 1)])
    mult = np.where(np.concatenate([np.full(Lmax + 1 - m, m) for m in range(Lmax + 1)]) > 0, 2.0, 1.0)
    mstart = np.array([m * (2 * Lmax + 1 - m) // 2 for m in range(Lmax + 1)], dtype=np.uintp)
    grad = np.sqrt(np.arange(Lmax + 1) * (np.arange(Lmax + 1) + 1.0))
    factors = []
    for (i0, i1, a, b, L, r, g) in bins:
        basis = _bin_basis(a, b, L, g)
        full = np.zeros((Lmax + 1, r[0]))
        full[:L + 1] = basis.phiJ
        fullg = np.zeros((Lmax + 1, r[1]))
        fullg[:L + 1] = basis.phiG * grad[:L + 1, None]
        factors.append((np.ascontiguousarray(full[lidx].T), np.ascontiguousarray(fullg[lidx].T)))
    return Lmax, lidx, mult, mstart, factors


def _target_data(Us, ks, bins, cache):
    """Per bin: (theta, phi) of the sorted kernel centres, the unit vectors e_theta, e_phi there, and the
    basis coefficients (alpha, ab) of D, N.u and the gradient (:func:`_coefficients`); reused from
    ``cache`` when Us, ks and the bins are those of the previous call (compared exactly: a solver
    evaluates the field at the same points at every stage)."""
    key = tuple(bins)
    hit = None if cache is None else cache.get("fh_targets")
    if (hit is not None and hit[0] == key and hit[1].shape == Us.shape and np.array_equal(hit[1], Us)
            and np.array_equal(hit[2], ks)):
        return hit[3]
    out = []
    for (i0, i1, a, b, L, r, g) in bins:
        basis = _bin_basis(a, b, L, g)
        kb = np.ascontiguousarray(ks[i0:i1])
        coef = []  # alpha_D, ab_D, alpha_N, ab_N, alpha_G, ab_G
        for beta in (basis.betaD, basis.betaN, basis.betaG):
            alpha = np.empty((beta.shape[2], i1 - i0))
            ab = np.empty((beta.shape[2], i1 - i0))
            _coefficients(kb, basis.edges, basis.kn, basis.bw, beta, alpha, ab)
            coef += [alpha, ab]
        loc = _loc(Us[i0:i1])
        ct, st, cp, sp = np.cos(loc[:, 0]), np.sin(loc[:, 0]), np.cos(loc[:, 1]), np.sin(loc[:, 1])
        eth = np.stack([ct * cp, ct * sp, -st], axis=1)
        eph = np.stack([-sp, cp, np.zeros_like(sp)], axis=1)
        out.append((loc, eth, eph, coef))
    if cache is not None:
        cache["fh_targets"] = (key, Us.copy(), ks.copy(), out)
    return out


def spectral_sums(U, kappa, Y, W, bins, order, nthreads, cache=None):
    """Shifted sums F (M, 4) = sum_j W_j exp(kappa_i (<u_i, y_j> - 1)) (1, y_j) and the bound delta (M,)
    of |F_hat - F| per component (see module notes), for the plan ``bins`` on targets sorted by
    ``order``.

    Parameters
    ----------
    U : (M, 3) unit kernel centres; kappa : (M,) concentrations
    Y : (N, 3) unit sources; W : (N,) weights >= 0
    bins : list from :func:`plan` (index ranges into the sorted targets)
    order : (M,) the sorting permutation of kappa
    nthreads : int
        Threads. The r_J + r_G basis-map syntheses of a bin are independent and each is small (ducc0 gains
        little from a second thread inside one call at L ~ 100): with nthreads > 1 they run side by side,
        one thread each, in a pool of nthreads workers (ducc0 releases the GIL).
    cache : dict, optional
        Keeps the (theta, phi) of the sorted targets and their basis coefficients between calls with the
        same targets and plan (a solver evaluates the field at the same points at every stage).
    """
    M = U.shape[0]
    Lmax, lidx, mult, mstart, factors = _plan_data(tuple(bins))
    alm = _source_moments(Y, W, Lmax, nthreads)
    # |a_lm|^2 weighted as in Parseval for a real map (m > 0 counted twice), per l
    pw = np.bincount(lidx, weights=mult * (alm.real ** 2 + alm.imag ** 2), minlength=Lmax + 1)
    ll1 = np.arange(Lmax + 1) * (np.arange(Lmax + 1) + 1.0)
    w1 = float(W.sum())
    Us = U[order]
    ks = kappa[order]
    Fs = np.empty((M, 4))
    ds = np.empty(M)
    targets = _target_data(Us, ks, bins, cache)
    # every basis map of every bin: (spin, basis index), spin-1 (the costlier) first, dealt round-robin
    # into SUM_GROUPS fixed groups per bin. A task is one group: it synthesises its maps in order into its
    # own buffer and adds them, weighted, into its own sums (per bin: D, N.u, the two gradient components
    # and three rounding sums; no r x m array of map values). The groups are added in a fixed order, so
    # the result does not depend on the thread count or on which thread ran what (issue #21 item 5).
    tasks = []
    for bi, b in enumerate(bins):
        maps = [(1, k) for k in range(b[5][1])] + [(0, k) for k in range(b[5][0])]
        tasks += [(bi, maps[g::SUM_GROUPS]) for g in range(min(SUM_GROUPS, len(maps)))]

    def run(task):
        bi, maps = task
        m = bins[bi][1] - bins[bi][0]
        L = bins[bi][4]
        coef = targets[bi][3]
        buf = np.empty((2, m))
        acc = np.zeros((7, m))
        for spin, k in maps:
            if spin == 0:
                a_lm = (alm * factors[bi][0][k])[None, :]  # in the worker
                out = buf[:1]
            else:
                a_lm = np.zeros((2, alm.shape[0]), dtype=alm.dtype)
                a_lm[0] = alm * factors[bi][1][k]  # E = sqrt(l (l + 1)) a_lm, B = 0: the gradient
                out = buf
            ducc0.sht.synthesis_general(alm=a_lm, spin=spin, lmax=L, mstart=mstart[:L + 1], loc=targets[bi][0],
                                        epsilon=EPS_SHT, nthreads=1, map=out)
            if spin == 0:
                _accumulate0(coef[0][k], coef[1][k], coef[2][k], coef[3][k], out[0], acc)
            else:
                _accumulate1(coef[4][k], coef[5][k], out, acc)
        return acc

    if nthreads > 1 and len(tasks) > 1:
        with ThreadPoolExecutor(max_workers=nthreads) as pool:
            sums = list(pool.map(run, tasks))  # in task order, whoever ran them
    else:
        sums = [run(t) for t in tasks]
    per_bin = [[] for _ in bins]
    for (bi, _), acc in zip(tasks, sums):
        per_bin[bi].append(acc)
    for bi, (i0, i1, a, b, L, r, g) in enumerate(bins):
        basis = _bin_basis(a, b, L, g)
        loc, eth, eph, coef = targets[bi]
        acc = per_bin[bi][0].copy()
        for part in per_bin[bi][1:]:
            acc += part
        kinv = 1.0 / ks[i0:i1]
        gth = acc[2] * kinv
        gph = acc[3] * kinv
        Fs[i0:i1, 0] = acc[0]
        # numerator: its component along u (kernel t exp(kappa (t - 1))) and its tangential part, the
        # surface gradient of D over kappa
        Fs[i0:i1, 1:] = acc[1][:, None] * Us[i0:i1] + gth[:, None] * eth + gph[:, None] * eph
        # transform error (model): each map's rms (Parseval; spin-1: sqrt(l (l + 1)) weighted) times the
        # sum over the maps of ab
        rms0 = np.sqrt(pw[:L + 1] @ basis.phiJ ** 2 / (4.0 * np.pi))
        rms1 = np.sqrt((pw[:L + 1] * ll1[:L + 1]) @ basis.phiG ** 2 / (4.0 * np.pi))
        tr = NUFFT_SAFETY * EPS_SHT
        # rounding: the r products and their sum, the coefficients (the Lagrange weights and the p + 1
        # products), the sum over the workers; ab_k >= |alpha_k|
        (rJ, rG), p = r, basis.p
        dD = w1 * basis.bound_D + tr * (rms0 @ coef[1]) + 4.0 * (rJ + 2 * p + 10) * EPS * acc[4]
        dN = w1 * basis.bound_N + tr * (rms0 @ coef[3]) + 4.0 * (rJ + 2 * p + 10) * EPS * acc[5]
        dG = kinv * (w1 * basis.bound_G + tr * (rms1 @ coef[5]) + 4.0 * (rG + 2 * p + 10) * EPS * acc[6])
        # the assembly (3 products and 2 sums per component, |u|, |e| <= 1 + 2 eps)
        dA = 8.0 * EPS * (np.abs(acc[1]) + np.abs(gth) + np.abs(gph))
        ds[i0:i1] = np.maximum(dD, dN + dG + dA)
    F = np.empty((M, 4))
    delta = np.empty(M)
    F[order] = Fs
    delta[order] = ds
    return F, delta
