"""Numba kernel of the attended density (:func:`spherepde.grids.adaptive.attended_density`).

Functions
---------
attended_sums(U, MT, Y, M, bstart, bc, bcr, bsr, blogm, G)
    Per chunk of targets x_k (rows of ``U`` = beta B^T x_k, masses ``MT``), the partial sums over the
    pixels y (rows of ``Y``, unit, masses ``M``) of g(y) = sum_k M_k exp(<U_k, y>) / Z_k, with
    Z_k = sum_y M_y exp(<U_k, y>): rows of ``G`` (chunks x pixels, zeroed by the caller).

The pixels come in spatially compact blocks (``bstart``; centres ``bc`` (n, 3), cos / sin of the angular
radii ``bcr``, ``bsr``, log masses ``blogm``), so that a target skips the blocks whose every term is
negligible. Per target:

1. the largest exponent s_k = max <U_k, y> over the pixels with mass, found exactly, visiting only the
   blocks whose bound exceeds the best value so far;
2. Z_k from the blocks whose terms reach e^LOG_NEAR of the largest, and from any other block whose bound
   reaches e^LOG_REST Z_k / blocks (the blocks skipped change Z_k by < e^LOG_REST = 4e-18 of it);
3. the scattered terms M_k exp(<U_k, y> - s_k) / Z_k of the near blocks (their exponentials kept from
   step 2) and of every other block whose bound reaches e^LOG_G = 2e-22. Each skipped term is below that,
   so g(y) changes by less than targets x 2e-22: < 1e-17 for 49152 targets (g is of order 1 on the mass),
   and sigma = f g by less than 1e-17 max f (the refinement's floors are relative to max f, 1e-4 by
   default).

The dense NumPy sums of :func:`spherepde.grids.adaptive._attended_density_dense` are the twin it is tested
against.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from .fastexp import fexp

__all__ = ["attended_sums", "LOG_G", "LOG_NEAR", "LOG_REST"]

#: Z_k: blocks whose bound reaches e^LOG_NEAR of the largest term are summed in the first pass.
LOG_NEAR = -40.0
#: Z_k: any other block is summed if its bound (log mass + exponent) reaches e^LOG_REST Z_k / (blocks).
LOG_REST = -40.0
#: g: a target's terms below e^LOG_G are skipped block by block.
LOG_G = -50.0
# reassoc lets LLVM vectorise the sums; no 'nnan'/'ninf' (the log masses hold -inf on purpose).
_FM = {"reassoc", "contract", "nsz", "arcp"}
#: Relative margin of the blocks' bounds over rounding (|U| x this).
_MARGIN = 1e-9


@nb.njit(inline="always")
def _bound(ux, uy, uz, nu, cx, cy, cz, cr, sr):
    """An upper bound of <u, y> over the cap of centre c and cos / sin radius cr / sr (|u| = nu)."""
    if nu == 0.0:
        return 0.0
    c = (ux * cx + uy * cy + uz * cz) / nu
    if c >= cr:  # u's direction lies in the cap
        return nu * (1.0 + _MARGIN)
    s = math.sqrt(max(0.0, 1.0 - c * c))
    return nu * (c * cr + s * sr + _MARGIN)  # nu cos(theta - r), theta > r


@nb.njit(parallel=True, fastmath=_FM, cache=True)
def attended_sums(U, MT, Y, M, bstart, bc, bcr, bsr, blogm, G):
    K = U.shape[0]
    nblk = bstart.shape[0] - 1
    nchunk = G.shape[0]
    yx = Y[:, 0].copy()
    yy = Y[:, 1].copy()
    yz = Y[:, 2].copy()
    pos = np.where(M > 0.0, 1.0, 0.0)
    log_rest = math.log(nblk)
    for c in nb.prange(nchunk):
        ub = np.empty(nblk)
        near = np.zeros(nblk, dtype=np.bool_)
        ebuf = np.empty(Y.shape[0])
        g = G[c]
        for k in range(c * K // nchunk, (c + 1) * K // nchunk):
            ux = U[k, 0]
            uy = U[k, 1]
            uz = U[k, 2]
            nu = math.sqrt(ux * ux + uy * uy + uz * uz)
            best = -np.inf
            ib = -1
            for b in range(nblk):
                v = _bound(ux, uy, uz, nu, bc[b, 0], bc[b, 1], bc[b, 2], bcr[b], bsr[b])
                ub[b] = v
                if blogm[b] > -np.inf and v > best:
                    best = v
                    ib = b
            if ib < 0:
                continue
            # s: the largest exponent over the pixels with mass, the best-bounded block first
            s = -np.inf
            for j in range(bstart[ib], bstart[ib + 1]):
                if M[j] > 0.0:
                    s = max(s, ux * yx[j] + uy * yy[j] + uz * yz[j])
            for b in range(nblk):
                if blogm[b] > -np.inf and ub[b] > s and b != ib:
                    for j in range(bstart[b], bstart[b + 1]):
                        if M[j] > 0.0:
                            s = max(s, ux * yx[j] + uy * yy[j] + uz * yz[j])
            # Z (shifted by e^-s): the near blocks (their terms kept for g), then the others that can matter
            Z = 0.0
            for b in range(nblk):
                near[b] = blogm[b] > -np.inf and ub[b] - s >= LOG_NEAR
                if near[b]:
                    for j in range(bstart[b], bstart[b + 1]):
                        e = fexp(min(ux * yx[j] + uy * yy[j] + uz * yz[j] - s, 0.0))
                        ebuf[j] = e
                        Z += M[j] * e
            thr = math.log(Z) + LOG_REST - log_rest
            for b in range(nblk):
                if ub[b] - s < LOG_NEAR and blogm[b] + ub[b] - s >= thr:
                    for j in range(bstart[b], bstart[b + 1]):
                        Z += M[j] * fexp(min(ux * yx[j] + uy * yy[j] + uz * yz[j] - s, 0.0))
            ck = MT[k] / Z
            lc = math.log(ck)
            for b in range(nblk):
                if near[b]:
                    for j in range(bstart[b], bstart[b + 1]):
                        g[j] += pos[j] * ck * ebuf[j]
                elif blogm[b] > -np.inf and ub[b] - s + lc >= LOG_G:
                    for j in range(bstart[b], bstart[b + 1]):
                        g[j] += pos[j] * ck * fexp(min(ux * yx[j] + uy * yy[j] + uz * yz[j] - s, 0.0))
