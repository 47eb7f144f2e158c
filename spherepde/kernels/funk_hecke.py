"""Funk-Hecke evaluation of the attention sums with fast spherical-harmonic transforms (ducc0).

For a target with kernel centre u and concentration kappa the four shifted sums are

    F^q(u, kappa) = sum_j W^q_j exp(kappa (<u, y_j> - 1)) = sum_l 4 pi e^-kappa i_l(kappa) sum_m a^q_lm Y_lm(u)

(W^0 = W, W^{1,2,3} = W y_x, W y_y, W y_z; a^q_lm from the adjoint synthesis, so no quadrature error:
ducc0's ring transform on HEALPix pixel centres, exact up to rounding, else its general one at accuracy
EPS_SHT). General B gives every target its own kappa, so kappa is handled by Chebyshev interpolation:
targets are split into bins [a, b] of kappa; in each bin the maps are synthesised (ducc0
``synthesis_general``) at the n + 1 Chebyshev points kappa_k of [a, b] and interpolated in kappa. Each
node map is added into the interpolated sums (weighted by its Lagrange weight at every target) by the
worker that synthesised it, while it is in cache.

Error bound per target (all terms are bounds on sum_j W_j |error of its kernel value|, so they hold for
the denominator and, since |y| = 1, for each numerator component):

- interpolation (rigorous): for fixed s = 1 - <u, y> in [0, 2], kappa -> exp(-kappa s) is entire and
  bounded by exp(s (hw (rho + 1/rho) / 2 - c)) on the Bernstein ellipse E_rho of [a, b] (centre c,
  half-width hw), so the degree-n Chebyshev interpolant is off by <= 4 M rho^-n / (rho - 1)
  (Trefethen, ATAP Thm 8.2); :func:`interp_bound` takes the best rho for every s (monotonicity in s
  makes a grid in s rigorous). Times ||W||_1.
- truncation at degree L (rigorous): the interpolant of the tail is <= Lebesgue(n) max_k tail_L(kappa_k),
  times ||W||_1.
- rounding of the interpolation: 4 (n + 3) eps sum_k |l_k(kappa)| |G_k| (a posteriori).
- transform error (a model, as the rounding model of the in-house path): ducc0 is asked for EPS_SHT;
  the error of a node map is taken as NUFFT_SAFETY * EPS_SHT * (rms of that map over the sphere, from
  Parseval), times the Lebesgue constant. Measured: <= 0.5 EPS_SHT rms (concentrated densities; 0.08 for
  smooth ones) at kappa 10..176, so the model has a margin of 20 or more.

Functions
---------
available()
    Whether ducc0 is importable.
interp_bound(a, b, n)
    Rigorous bound of the kernel interpolation error on [a, b] at degree n.
plan(kappa_sorted, goal, lmax_cap)
    Bins, degrees and node counts.
spectral_sums(U, kappa, Y, W, bins, order, nthreads, cache=None)
    The four sums and the per-target error bound.
healpix_ring_nside(Y)
    nside if Y are the HEALPix pixel centres in RING order, else 0.
"""
from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .attention import sph_bessel_scaled, sph_tail

try:  # optional at import time; pyproject lists it as a dependency
    import ducc0
except ImportError:  # pragma: no cover
    ducc0 = None

__all__ = ["available", "healpix_ring_nside", "interp_bound", "plan", "spectral_sums", "EPS_SHT", "NUFFT_SAFETY"]

#: Accuracy asked of ducc0's transforms (its floor for float64 is 2e-13).
EPS_SHT = 3e-13
#: Margin of the transform error model over the largest measured error (see the module notes).
NUFFT_SAFETY = 10.0
EPS = float(np.finfo(float).eps)
#: Most Chebyshev nodes per bin, and most bins.
NMAX = 40
MAX_BINS = 8
#: Cost model (CPU seconds, measured on the 2-core AVX2 machine): per synthesis call and per point.
T_CALL = 7e-5
T_LL = 1.5e-7
T_POINT = 1e-7


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
    NMAX + 1. n = 0 is tried first: its bound has its own formula (not on the rho grid of n >= 1), and it
    is the one that meets the goal for a conformal B (an interval of rounding width)."""
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


def plan(kappa_sorted: np.ndarray, goal: float, lmax_cap: int):
    """Split the (sorted) kappa range into bins; returns (cost, [(i0, i1, a, b, L, n), ...]) with the
    cheapest number of geometric bins (1..MAX_BINS) by the cost model, or (inf, None) if no plan meets
    the goal within lmax_cap / NMAX."""
    M = kappa_sorted.shape[0]
    kmin, kmax = float(kappa_sorted[0]), float(kappa_sorted[-1])
    best = (math.inf, None)
    for J in range(1, MAX_BINS + 1):
        if J == 1 or kmin <= 0.0:
            edges = np.linspace(kmin, kmax, J + 1)
        else:
            edges = np.geomspace(kmin, kmax, J + 1)
        edges[0], edges[-1] = kmin, kmax
        bins = []
        cost = 0.0
        ok = True
        for q in range(J):
            a, b = float(edges[q]), float(edges[q + 1])
            i0 = int(np.searchsorted(kappa_sorted, a, "left")) if q > 0 else 0
            i1 = int(np.searchsorted(kappa_sorted, b, "right")) if q < J - 1 else M
            if i1 <= i0:
                continue
            a, b = float(kappa_sorted[i0]), float(kappa_sorted[i1 - 1])
            L = _degree(b, goal / 3.0, lmax_cap)
            n = _nodes_needed(a, b, goal / 3.0)
            if L > lmax_cap or n > NMAX:
                ok = False
                break
            bins.append((i0, i1, a, b, L, n))
            cost += 4 * (n + 1) * (T_CALL + T_LL * L * L + T_POINT * (i1 - i0))
        if ok and cost < best[0]:
            best = (cost, bins)
    return best


def _loc(P):
    """(theta, phi) of unit vectors (rows)."""
    th = np.arccos(np.clip(P[:, 2], -1.0, 1.0))
    ph = np.mod(np.arctan2(P[:, 1], P[:, 0]), 2.0 * np.pi)
    return np.ascontiguousarray(np.stack([th, ph], axis=1))


@numba.njit(parallel=True, cache=True)
def _lagrange(kb, kn, bw, lag):
    """Barycentric (second kind) Lagrange weights lag[k, i] = l_k(kb[i]) of the nodes kn with weights bw;
    a kappa on a node takes that node's value (nodes of a tiny interval may coincide: the first)."""
    n1 = kn.shape[0]
    for i in numba.prange(kb.shape[0]):
        kap = kb[i]
        hit = -1
        for k in range(n1):
            if kap == kn[k]:
                hit = k
                break
        if hit >= 0:
            for k in range(n1):
                lag[k, i] = 0.0
            lag[hit, i] = 1.0
            continue
        tsum = 0.0
        for k in range(n1):
            t = bw[k] / (kap - kn[k])
            lag[k, i] = t
            tsum += t
        r = 1.0 / tsum
        for k in range(n1):
            lag[k, i] *= r


@numba.njit(nogil=True, cache=True)
def _accumulate(lk, g, acc, q):
    """acc[q] += lk g (one node map into its interpolated sum) and, for the denominator map (q = 0),
    acc[4] += |lk| |g| (the a posteriori rounding bound); runs in the worker that synthesised g, while
    g is in cache."""
    a = acc[q]
    for i in range(g.shape[0]):
        a[i] += lk[i] * g[i]
    if q == 0:
        b = acc[4]
        for i in range(g.shape[0]):
            b[i] += abs(lk[i]) * abs(g[i])


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
    """a^q_lm (q = 0..3) of the maps W, W y_x, W y_y, W y_z: sum_j W^q_j conj(Y_lm(y_j)).

    On the HEALPix pixel centres (RING order) this is ducc0's ring adjoint synthesis (exact up to
    rounding: the centres lie on iso-latitude rings with equispaced longitudes); elsewhere the
    general (NUFFT) one at accuracy EPS_SHT."""
    maps = np.stack([W, W * Y[:, 0], W * Y[:, 1], W * Y[:, 2]])
    ns = healpix_ring_nside(Y)
    if ns:
        adjoint, where = ducc0.sht.adjoint_synthesis, _healpix_geometry(ns)
    else:
        adjoint, where = ducc0.sht.adjoint_synthesis_general, {"loc": _loc(Y), "epsilon": EPS_SHT}
    return [adjoint(map=m[None, :], spin=0, lmax=Lmax, nthreads=nthreads, **where)[0] for m in maps]


@functools.lru_cache(maxsize=4)
def _healpix_geometry(nside):
    return ducc0.healpix.Healpix_Base(nside, "RING").sht_info()


@functools.lru_cache(maxsize=8)
def _node_data(bins, Lmax):
    """Per bin of a plan: Chebyshev nodes, per-node degree Lk and Funk-Hecke factors 4 pi e^-kappa i_l
    (zero-padded to degree Lmax), the largest tail, and the a priori interpolation bound and Lebesgue
    constant. Depends on the plan only, so repeated evaluations (every stage of a run) reuse it.
    """
    out = []
    for (i0, i1, a, b, L, n) in bins:
        kn = nodes(a, b, n)
        # the bin's degree L is set by its largest kappa; a smaller node kappa needs fewer degrees for the
        # same tail (tail_L grows with kappa), so each node gets the least Lk with a tail no larger than
        # the top node's: the bound (max over nodes) is unchanged, the syntheses cost ~Lk^2
        tail_ref = sph_tail(float(kn.max()), L, max(30, int(kn.max()) + 30))
        tails = 0.0
        per_node = []
        for kap in kn:
            Lk = min(_degree(float(kap), tail_ref, L), L)
            il, tail = sph_bessel_scaled(float(kap), Lk, max(30, int(kap) + 30))
            tails = max(tails, tail)
            cl = 4.0 * np.pi * il
            cfull = np.zeros(Lmax + 1)
            cfull[:Lk + 1] = cl
            per_node.append((Lk, cl, cfull))
        out.append((kn, per_node, tails, interp_bound(a, b, n), lebesgue(n)))
    return out


def _target_locations(Us, bins, cache):
    """(theta, phi) of the sorted kernel centres, per bin; reused from ``cache`` when Us and the bins are
    those of the previous call (compared exactly)."""
    key = tuple((b[0], b[1]) for b in bins)
    hit = None if cache is None else cache.get("fh_locations")
    if hit is not None and hit[0] == key and hit[1].shape == Us.shape and np.array_equal(hit[1], Us):
        return hit[2]
    locs = [_loc(Us[i0:i1]) for (i0, i1, *_rest) in bins]
    if cache is not None:
        cache["fh_locations"] = (key, Us.copy(), locs)
    return locs


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
        Threads. The 4 (n + 1) node syntheses of a plan are independent and each is small (ducc0 gains
        little from a second thread inside one call at L ~ 100): with nthreads > 1 they run side by side,
        one thread each, in a pool of nthreads workers (ducc0 releases the GIL).
    cache : dict, optional
        Keeps the (theta, phi) of the sorted targets between calls with the same targets and plan (a
        solver evaluates the field at the same points at every stage).
    """
    M = U.shape[0]
    Lmax = max(L for *_, L, _ in bins)
    alm = _source_moments(Y, W, Lmax, nthreads)
    lidx = np.concatenate([np.arange(m, Lmax + 1) for m in range(Lmax + 1)])
    mult = np.where(np.concatenate([np.full(Lmax + 1 - m, m) for m in range(Lmax + 1)]) > 0, 2.0, 1.0)
    # |a_lm|^2 weighted as in Parseval for a real map (m > 0 counted twice), per l, per map
    pw = np.stack([np.bincount(lidx, weights=mult * np.abs(a) ** 2, minlength=Lmax + 1) for a in alm])
    mstart = np.array([m * (2 * Lmax + 1 - m) // 2 for m in range(Lmax + 1)], dtype=np.uintp)
    w1 = float(W.sum())
    Us = U[order]
    ks = kappa[order]
    Fs = np.empty((M, 4))
    ds = np.empty(M)
    nodedata = _node_data(tuple(tuple(b) for b in bins), Lmax)
    locs = _target_locations(Us, bins, cache)
    # every node of every bin: its syntheses (pooled), and the rms of its maps for the transform error
    jobs = []  # (bin index, node index, map index, Funk-Hecke factors of the node, L)
    info = []  # per bin: (loc, rms, Lagrange weights (n + 1, m))
    for b, ((i0, i1, a, b_, L, n), (kn, per_node, tails, ib, lam)) in enumerate(zip(bins, nodedata)):
        rms = 0.0
        for k, (Lk, cl, cfull) in enumerate(per_node):
            for q in range(4):
                jobs.append((b, k, q, cfull, Lk))
            rms = max(rms, math.sqrt(float(np.max(pw[:, :Lk + 1] @ (cl * cl))) / (4.0 * np.pi)))
        # barycentric interpolation (second kind: weights (-1)^k, halved at the ends)
        bw = (-1.0) ** np.arange(n + 1)
        bw[0] *= 0.5
        bw[-1] *= 0.5
        lag = np.empty((n + 1, i1 - i0))
        _lagrange(np.ascontiguousarray(ks[i0:i1]), kn, bw, lag)
        info.append((locs[b], rms, lag))
    # each worker synthesises node maps into its own buffer and adds them, weighted, into its own sums
    # (per bin: 4 interpolated sums and the rounding sum): no (n + 1) x 4 x m array of node values
    mmax = max(i1 - i0 for (i0, i1, *_rest) in bins)
    workspace = {}
    lock = threading.Lock()

    def synth(job):
        b, k, q, cfull, L = job
        a_lm = alm[q] * cfull[lidx]  # in the worker
        tid = threading.get_ident()
        ws = workspace.get(tid)
        if ws is None:
            ws = (np.empty((1, mmax)), [np.zeros((5, i1 - i0)) for (i0, i1, *_rest) in bins])
            with lock:
                workspace[tid] = ws
        m = bins[b][1] - bins[b][0]
        buf = ws[0][:, :m]
        ducc0.sht.synthesis_general(alm=a_lm[None, :], spin=0, lmax=L, mstart=mstart[:L + 1], loc=info[b][0],
                                    epsilon=EPS_SHT, nthreads=1, map=buf)
        _accumulate(info[b][2][k], buf[0], ws[1][b], q)

    if nthreads > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=nthreads) as pool:
            list(pool.map(synth, jobs))
    else:
        for job in jobs:
            synth(job)
    parts = list(workspace.values())
    for b, ((i0, i1, a, b_, L, n), (kn, per_node, tails, ib, lam)) in enumerate(zip(bins, nodedata)):
        acc = parts[0][1][b].copy()
        for ws in parts[1:]:
            acc += ws[1][b]
        Fs[i0:i1] = acc[:4].T
        # rounding of the interpolation (weights, the n + 1 products, the sum over the workers):
        # |G^q| <= |G^0| up to the transform error
        rnd = 4.0 * (n + 3) * EPS * acc[4]
        ds[i0:i1] = w1 * (ib + lam * tails) + NUFFT_SAFETY * EPS_SHT * lam * info[b][1] + rnd
    F = np.empty((M, 4))
    delta = np.empty(M)
    F[order] = Fs
    delta[order] = ds
    return F, delta
