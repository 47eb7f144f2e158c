"""Numba kernels for the softmax-attention mean field on the sphere.

Functions
---------
direct3(U, kappa, S, W, LW, out)
    O(N M) exact sum for d = 3 (sources in SoA layout), parallel over targets, vectorised.
direct_nd(U, kappa, S, W, LW, out)
    The same for any dimension d.
pruned(U, kappa, S, W, LW, bstart, bc, bcr, bsr, blogm, sstart, sc, scr, ssr, slogm, eps, out, work)
    Block-pruned sum with a guaranteed bound: the skipped mass is <= eps * D at every target.
sph_coeffs(S, W, L, ra, rb)
    Source-side spherical-harmonic moments of the four maps w, w y_x, w y_y, w y_z (d = 3).
sph_eval(U, kappa, coeffs, L, ra, rb, wnorm1, wnorm2, out, bound)
    Funk-Hecke evaluation at the targets, with a per-target error bound.

Conventions shared by all kernels: a target is given by u = B^T x / |B^T x| (unit, rows of ``U``)
and kappa = beta |B^T x| >= 0; sources are rows of ``S`` (d, N) (transposed: unit stride over
sources), weights ``W`` >= 0 and ``LW = log W`` (-inf where W = 0). The kernel is

    K(u, y) = exp(kappa (<u, y> - 1)) = exp(-kappa |u - y|^2 / 2)   (|u| = |y| = 1),

written with |u - y|^2 so that the exponents of the terms that matter (near u) carry a small
absolute rounding error, not kappa * 1e-16. ``out[i] = sum_j y_j K_ij W_j / sum_j K_ij W_j``.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from .fastexp import fexp

__all__ = ["direct3", "direct_nd", "pruned", "sph_coeffs", "sph_eval", "sph_recurrence"]

# reassoc lets LLVM vectorise the reductions; no 'nnan'/'ninf' (LW holds -inf on purpose).
_FM = {"reassoc", "contract", "nsz", "arcp"}
#: A shifted denominator below this is recomputed with the exact log-domain shift (its terms may be
#: subnormal, or all zero, when the target is far from all mass or the weights are tiny).
TINY = 1e-200


@nb.njit(fastmath=_FM, inline="always")
def _sum3(ux, uy, uz, h, sx, sy, sz, W, j0, n):
    d = 0.0
    nx = 0.0
    ny = 0.0
    nz = 0.0
    for jj in range(n):
        j = j0 + jj
        ax = ux - sx[j]
        ay = uy - sy[j]
        az = uz - sz[j]
        e = W[j] * fexp(-h * (ax * ax + ay * ay + az * az))
        d += e
        nx += e * sx[j]
        ny += e * sy[j]
        nz += e * sz[j]
    return d, nx, ny, nz


@nb.njit(fastmath=_FM, inline="always")
def _sum3_log(ux, uy, uz, h, sx, sy, sz, LW, shift, j0, n):
    d = 0.0
    nx = 0.0
    ny = 0.0
    nz = 0.0
    for jj in range(n):
        j = j0 + jj
        ax = ux - sx[j]
        ay = uy - sy[j]
        az = uz - sz[j]
        e = fexp(LW[j] - shift - h * (ax * ax + ay * ay + az * az))
        d += e
        nx += e * sx[j]
        ny += e * sy[j]
        nz += e * sz[j]
    return d, nx, ny, nz


@nb.njit(fastmath=_FM, inline="always")
def _max3_log(ux, uy, uz, h, sx, sy, sz, LW, j0, n):
    mx = -np.inf
    for jj in range(n):
        j = j0 + jj
        ax = ux - sx[j]
        ay = uy - sy[j]
        az = uz - sz[j]
        mx = max(mx, LW[j] - h * (ax * ax + ay * ay + az * az))
    return mx


@nb.njit(parallel=True, fastmath=_FM)
def direct3(U, kappa, S, W, LW, out):
    """Exact attention mean for d = 3, O(N) per target.

    Parameters
    ----------
    U : (M, 3) float64
        Unit kernel centres u_i = B^T x_i / |B^T x_i| (any unit vector where kappa = 0).
    kappa : (M,) float64
        Concentrations beta |B^T x_i| >= 0.
    S : (3, N) float64
        Source points (unit), transposed.
    W, LW : (N,) float64
        Weights >= 0 (not all 0) and their logarithms (-inf where 0).
    out : (M, 3) float64
        Receives m_i.

    Notes
    -----
    m_i = sum_j y_j W_j exp(-kappa_i |u_i - y_j|^2 / 2) / sum_j W_j exp(...): exponents <= 0. Where
    the denominator falls below ``TINY`` (target far from all mass, or tiny weights) the target is
    redone with the shift max_j(log W_j - kappa_i |u_i - y_j|^2 / 2), so the largest term is 1.
    """
    M = U.shape[0]
    N = S.shape[1]
    sx = S[0]
    sy = S[1]
    sz = S[2]
    for i in nb.prange(M):
        ux = U[i, 0]
        uy = U[i, 1]
        uz = U[i, 2]
        h = 0.5 * kappa[i]
        d, nx, ny, nz = _sum3(ux, uy, uz, h, sx, sy, sz, W, 0, N)
        if not d > TINY:
            shift = _max3_log(ux, uy, uz, h, sx, sy, sz, LW, 0, N)
            d, nx, ny, nz = _sum3_log(ux, uy, uz, h, sx, sy, sz, LW, shift, 0, N)
        out[i, 0] = nx / d
        out[i, 1] = ny / d
        out[i, 2] = nz / d


@nb.njit(parallel=True, fastmath=_FM)
def direct_nd(U, kappa, S, W, LW, out):
    """Exact attention mean for any d (see :func:`direct3`; S is (d, N), U and out are (M, d))."""
    M, dim = U.shape
    N = S.shape[1]
    for i in nb.prange(M):
        h = 0.5 * kappa[i]
        u = U[i]
        acc = np.zeros(dim)
        d = 0.0
        for j in range(N):
            q = 0.0
            for k in range(dim):
                a = u[k] - S[k, j]
                q += a * a
            e = W[j] * fexp(-h * q)
            d += e
            for k in range(dim):
                acc[k] += e * S[k, j]
        if not d > TINY:
            shift = -np.inf
            for j in range(N):
                q = 0.0
                for k in range(dim):
                    a = u[k] - S[k, j]
                    q += a * a
                shift = max(shift, LW[j] - h * q)
            d = 0.0
            acc[:] = 0.0
            for j in range(N):
                q = 0.0
                for k in range(dim):
                    a = u[k] - S[k, j]
                    q += a * a
                e = fexp(LW[j] - shift - h * q)
                d += e
                for k in range(dim):
                    acc[k] += e * S[k, j]
        for k in range(dim):
            out[i, k] = acc[k] / d


@nb.njit(inline="always")
def _logbound(u, C, cr, sr, logm, kap, k):
    """log of an upper bound of sum_{j in cluster k} W_j exp(kappa(<u, y_j> - 1)).

    With theta the angle from u to the cluster centre and r its angular radius, every point of the
    cluster has <u, y> <= cos(max(theta - r, 0)).
    """
    dim = u.shape[0]
    c = 0.0
    for q in range(dim):
        c += u[q] * C[q, k]
    if c >= cr[k]:
        cd = 1.0
    else:
        cd = c * cr[k] + math.sqrt(max(1.0 - c * c, 0.0)) * sr[k]
        cd = min(cd, 1.0)
    return logm[k] + kap * (cd - 1.0)


@nb.njit(fastmath=_FM, inline="always")
def _block_nd(u, h, S, LW, shift, j0, n, acc):
    dim = u.shape[0]
    d = 0.0
    for jj in range(n):
        j = j0 + jj
        q = 0.0
        for k in range(dim):
            a = u[k] - S[k, j]
            q += a * a
        e = fexp(LW[j] - shift - h * q)
        d += e
        for k in range(dim):
            acc[k] += e * S[k, j]
    return d


@nb.njit(fastmath=_FM, inline="always")
def _blockmax_nd(u, h, S, LW, j0, n):
    dim = u.shape[0]
    mx = -np.inf
    for jj in range(n):
        j = j0 + jj
        q = 0.0
        for k in range(dim):
            a = u[k] - S[k, j]
            q += a * a
        mx = max(mx, LW[j] - h * q)
    return mx


#: Blocks whose bound is within exp(-NEAR) of the best block are summed first (pass 1), so that the
#: partial denominator that sets the pruning threshold is close to the full one.
NEAR = 20.0
#: Rescale the running sums when a block could exceed them by more than exp(RESCALE).
RESCALE = 500.0


@nb.njit(inline="always")
def _add_block(u, h, S, LW, j0, n, state, acc, tmp, three):
    """Add one block to the online log-sum-exp state = [sigma, D, started] and acc (numerator)."""
    dim = u.shape[0]
    if three:
        if state[2] == 0.0:
            state[0] = _max3_log(u[0], u[1], u[2], h, S[0], S[1], S[2], LW, j0, n)
            state[2] = 1.0
        d, nx, ny, nz = _sum3_log(u[0], u[1], u[2], h, S[0], S[1], S[2], LW, state[0], j0, n)
        tmp[0] = nx
        tmp[1] = ny
        tmp[2] = nz
    else:
        if state[2] == 0.0:
            state[0] = _blockmax_nd(u, h, S, LW, j0, n)
            state[2] = 1.0
        tmp[:] = 0.0
        d = _block_nd(u, h, S, LW, state[0], j0, n, tmp)
    state[1] += d
    for k in range(dim):
        acc[k] += tmp[k]


@nb.njit(parallel=True)
def pruned(U, kappa, S, W, LW, bstart, bc, bcr, bsr, blogm, sstart, sc, scr, ssr, slogm, eps, out, nsum):
    """Pruned attention mean: exact sums over the blocks that matter, a bound for the rest.

    Parameters
    ----------
    U, kappa : (M, d), (M,)
        Kernel centres and concentrations (see :func:`direct3`).
    S, W, LW : (d, N), (N,), (N,)
        Sources sorted so that each block is a contiguous range, weights and log-weights.
    bstart : (nb + 1,) int64
        Block k holds sources bstart[k]:bstart[k+1].
    bc, bcr, bsr, blogm : (d, nb), (nb,), (nb,), (nb,)
        Block centres (unit), cos and sin of the angular radii, log of the block masses.
    sstart : (ns + 1,) int64
        Super-block s holds blocks sstart[s]:sstart[s+1].
    sc, scr, ssr, slogm : (d, ns), (ns,), (ns,), (ns,)
        The same geometry for the super-blocks.
    eps : float
        Relative mass allowed to be skipped: |m_hat - m| <= 2 eps at every target.
    out : (M, d) float64
        Receives m_i.
    nsum : (M,) int64
        Receives the number of sources summed exactly at each target (cost diagnostic).

    Notes
    -----
    With l_k the log-bound of block k (:func:`_logbound`), pass 1 sums every block within
    exp(-NEAR) of the best block of the best super-block, giving D_1 <= D. Pass 2 sums every
    remaining block (and super-block) whose bound exceeds eps D_1 / (nb + ns); what is skipped is
    at most eps D_1 <= eps D for the denominator and, since |y| = 1, for the numerator's norm, so
    |N/D - N_hat/D_hat| <= 2 eps. Sums are an online log-sum-exp over blocks (no overflow or
    underflow for any kappa and any weights).
    """
    M, dim = U.shape
    nbk = bstart.shape[0] - 1
    ns = sstart.shape[0] - 1
    three = dim == 3
    logunits = math.log(nbk + ns)
    logeps = math.log(eps)
    nchunk = (M + 63) // 64
    for c in nb.prange(nchunk):
        Ls = np.empty(ns)
        acc = np.empty(dim)
        tmp = np.empty(dim)
        state = np.empty(3)
        u = np.empty(dim)
        for i in range(c * 64, min(M, c * 64 + 64)):
            for k in range(dim):
                u[k] = U[i, k]
            kap = kappa[i]
            h = 0.5 * kap
            best = -np.inf
            sbest = 0
            for s in range(ns):
                Ls[s] = _logbound(u, sc, scr, ssr, slogm, kap, s)
                if Ls[s] > best:
                    best = Ls[s]
                    sbest = s
            best = -np.inf
            for k in range(sstart[sbest], sstart[sbest + 1]):
                best = max(best, _logbound(u, bc, bcr, bsr, blogm, kap, k))
            cut = best - NEAR
            state[0] = 0.0
            state[1] = 0.0
            state[2] = 0.0
            acc[:] = 0.0
            cnt = 0
            # pass 1: the near blocks
            for s in range(ns):
                if Ls[s] < cut:
                    continue
                for k in range(sstart[s], sstart[s + 1]):
                    lk = _logbound(u, bc, bcr, bsr, blogm, kap, k)
                    if lk < cut:
                        continue
                    if state[2] != 0.0 and lk > state[0] + RESCALE:
                        _rescale(u, h, S, LW, bstart[k], bstart[k + 1] - bstart[k], state, acc, three)
                    _add_block(u, h, S, LW, bstart[k], bstart[k + 1] - bstart[k], state, acc, tmp, three)
                    cnt += bstart[k + 1] - bstart[k]
            # pass 2: everything whose bound exceeds the per-unit share of eps * D_1
            thr = logeps + math.log(state[1]) + state[0] - logunits
            for s in range(ns):
                if Ls[s] < thr:
                    continue
                near = Ls[s] >= cut
                for k in range(sstart[s], sstart[s + 1]):
                    lk = _logbound(u, bc, bcr, bsr, blogm, kap, k)
                    if lk < thr or (near and lk >= cut):
                        continue
                    if lk > state[0] + RESCALE:
                        _rescale(u, h, S, LW, bstart[k], bstart[k + 1] - bstart[k], state, acc, three)
                    _add_block(u, h, S, LW, bstart[k], bstart[k + 1] - bstart[k], state, acc, tmp, three)
                    cnt += bstart[k + 1] - bstart[k]
            for k in range(dim):
                out[i, k] = acc[k] / state[1]
            nsum[i] = cnt


@nb.njit(inline="always")
def _rescale(u, h, S, LW, j0, n, state, acc, three):
    if three:
        mx = _max3_log(u[0], u[1], u[2], h, S[0], S[1], S[2], LW, j0, n)
    else:
        mx = _blockmax_nd(u, h, S, LW, j0, n)
    if mx > state[0]:
        f = fexp(state[0] - mx)
        state[1] *= f
        for k in range(u.shape[0]):
            acc[k] *= f
        state[0] = mx
