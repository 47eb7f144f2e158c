"""Adaptive HEALPix grids: cells of mixed orders on the 12 NESTED quadtrees of HEALPix.

A cell of order k is the NESTED pixel p at nside 2^k, identified by its multi-order index
NUNIQ = 4 * (2^k)^2 + p (the convention of healpy's multi-order maps, mhealpy, MOCPy and ligo.skymap);
its children are the pixels 4p .. 4p + 3 of order k + 1. In face coordinates a cell is the square
[x0, x0 + h] x [y0, y0 + h] of its base face, h = 2^-k, and its edges are the same lattice curves as the
uniform grid's (:mod:`spherepde.grids.healpix`): exact curved geometry, Gauss points on the curves.

What a grid here is
-------------------
- **Leaves.** The cells are the leaves of a complete tiling between ``nside_min`` and ``nside_max``, kept
  2:1 balanced across edges *and corners* (neighbouring cells differ by at most one order): the
  reconstruction stencil of a cell is then the leaves that touch it, found through the ring of pixels of
  order k + 1 around it (at most 12), and every face is either between two cells of one order or a
  fine cell's full edge against half of a coarse cell's edge.
- **Faces.** Every face is built from its finer side (same order: from the cell first in the cell order):
  a coarse cell's edge next to two fine cells is two sub-faces, each the fine cell's edge with the same
  Gauss rule (graded towards the poles) as on a uniform grid, and the two sub-faces are exactly the two
  halves of the coarse edge (one curve). Each face is computed once and enters its two cells with
  opposite signs: mass is conserved to round-off across refinement boundaries.
- **Order of cells.** Cells are sorted by their first descendant at order ``nside_max`` (the Morton, or
  NESTED, order of the finest level), so a uniform adaptive grid is the NESTED ordering of
  :class:`~spherepde.grids.healpix.HealpixGrid` (which is RING ordered; ``hp.nest2ring`` maps one to the
  other).
- **It is a grid like the others.** The arrays of :class:`~spherepde.grids.base.Grid` (cells, faces,
  incidence, least-squares stencils in tangent frames) are filled for the mixed cells, so the solver,
  kernels, steppers, models, particles, W2 and diagnostics take it unchanged.

Bookkeeping is written here with healpy's NESTED neighbour tables: mhealpy and MOCPy hold multi-order
pixel sets (NUNIQ conversions, set operations, coverage) but neither gives edge adjacency across orders,
face geometry or balance, which is what a finite-volume grid needs; a NUNIQ is one line
(:func:`nest_to_uniq`), so no dependency is added for it.

Refinement (:meth:`AdaptiveHealpixGrid.adapt`) returns a new grid; :func:`transfer` moves a density from
one grid to another conservatively (a refined cell's children get its limited linear reconstruction, a
coarsened parent the area-weighted mean of its children): the mass is exact to round-off and the result
is non-negative where the density is.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cached_property

import healpy as hp
import numba
import numpy as np

from .._checks import finite_float, positive_int
from ..evaluation.methods import cap_geometry
from ..kernels import attended as _att
from ..kernels.arrays import take_rows
from ..kernels.fv import OUTFLOW_MARGIN
from ._healpix_map import FACE_AREA, face_map
from .base import (Grid, _stencil_classes, ambient_coef, incidence, least_squares_stencil, quadratic_pairs,
                   quadratic_width, tangent_frames)
from .healpix import _EDGES, HealpixGrid, _set_faces, _square_rule, edge_quadrature

__all__ = ["AdaptiveHealpixGrid", "Refinement", "attended_density", "nest_to_uniq", "uniq_to_nest", "transfer"]

#: Widest reconstruction stencil: the 12 pixels of order k + 1 around a cell, each in a distinct leaf.
STENCIL_WIDTH = 12
#: Most faces of one cell: 4 edges, each split into 2 sub-faces next to finer cells.
FACE_WIDTH = 8
#: Highest order healpy's NESTED functions take (nside 2^29).
MAX_ORDER = 29


def nest_to_uniq(order, ipix) -> np.ndarray:
    """NUNIQ = 4 * 4^order + ipix of NESTED pixels ``ipix`` at ``order`` (nside = 2^order)."""
    order = np.asarray(order, np.int64)
    return (np.int64(4) << (2 * order)) + np.asarray(ipix, np.int64)


def uniq_to_nest(uniq):
    """(order, ipix) of NUNIQ indices: order = floor(log2(uniq / 4) / 2), ipix = uniq - 4 * 4^order."""
    u = np.asarray(uniq, np.int64)
    if u.size and u.min() < 4:
        raise ValueError(f"a NUNIQ index is >= 4, got {int(u.min())}")
    order = ((np.floor(np.log2(u)).astype(np.int64)) - 2) // 2
    # floor(log2) in floating point can be off by one for huge values: correct exactly
    order = np.where((np.int64(4) << (2 * order)) > u, order - 1, order)
    order = np.where((np.int64(4) << (2 * (order + 1))) <= u, order + 1, order)
    return order, u - (np.int64(4) << (2 * order))


def _order_of(nside: int, name: str) -> int:
    nside = positive_int(nside, name, minimum=1)
    k = int(nside).bit_length() - 1
    if nside != 1 << k or k > MAX_ORDER:
        raise ValueError(f"{name} must be a power of 2 between 1 and 2^{MAX_ORDER} (NESTED quadtrees), got {nside}")
    return k


class _Leaves:
    """A sorted set of leaf NUNIQs with lookups by (order, ipix) and by ancestor."""

    def __init__(self, uniq: np.ndarray):
        self.uniq = np.asarray(uniq, np.int64)
        self._sorted = np.argsort(self.uniq, kind="stable")
        self._keys = self.uniq[self._sorted]
        self._ranges = None  # (kref, sorted starts, their ends) of the leaves' NESTED ranges at order kref

    def _range_table(self):
        """(kref, starts, ends, leaf index, leaf order) of the leaves' NESTED ranges at the finest order
        present, sorted by start: the leaves tile the sphere, so the ranges tile [0, 12 4^kref)."""
        if self._ranges is None:
            o, p = uniq_to_nest(self.uniq)
            kref = int(o.max())
            start, end = p << (2 * (kref - o)), (p + 1) << (2 * (kref - o))
            srt = np.argsort(start, kind="stable")  # (a few ascending runs, one per order: the stable sort's merge)
            self._ranges = (kref, start[srt], end[srt], srt, o[srt])
        return self._ranges

    def refined(self, order: int, ipix) -> np.ndarray:
        """True where pixel (order, ipix) holds a smaller leaf (it is refined further), by one search in the
        leaves' NESTED ranges at their finest order (``order`` at most that order)."""
        kref, start, end, _, _ = self._range_table()
        if int(order) >= kref:  # no leaf is smaller than a pixel of the finest order present
            return np.zeros(np.shape(ipix), bool)
        sh = 2 * (kref - int(order))
        a = np.asarray(ipix, np.int64) << sh
        b = (np.asarray(ipix, np.int64) + 1) << sh
        return end[np.searchsorted(start, a, side="right") - 1] < b

    def index(self, uniq) -> np.ndarray:
        """Leaf index of each NUNIQ, -1 where it is not a leaf."""
        u = np.asarray(uniq, np.int64)
        pos = np.searchsorted(self._keys, u)
        pos = np.minimum(pos, len(self._keys) - 1)
        hit = self._keys[pos] == u
        return np.where(hit, self._sorted[pos], -1)

    def containing(self, order, ipix, up: int = 2) -> np.ndarray:
        """Leaf index of the leaf equal to or containing pixel (order, ipix), at most ``up`` orders up;
        -1 where none is (the pixel is refined). One search in the leaves' NESTED ranges: the leaf whose
        range holds the pixel's first descendant (or ancestor) at the finest order present contains the
        pixel iff its order is at most the pixel's."""
        kref, start, _, leaf, lorder = self._range_table()
        order = np.asarray(order, np.int64)
        ipix = np.asarray(ipix, np.int64)
        a = (ipix << np.maximum(2 * (kref - order), 0)) >> np.maximum(2 * (order - kref), 0)
        j = np.searchsorted(start, a, side="right") - 1
        lo = lorder[j]
        return np.where((lo <= order) & (order - lo <= up), leaf[j], -1)


def _unique(a: np.ndarray) -> np.ndarray:
    """np.unique of a 1-d integer array by sorting (NumPy 2's hash-based np.unique took 49 ms on 150k
    NUNIQs against 8 ms for this: it ran several times per regrid)."""
    a = np.sort(a, kind="stable")  # (ascending runs: merged in ~0.2 ms where the default sort took 8 ms at 181k)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def _levels(order: np.ndarray) -> np.ndarray:
    """The distinct orders present, ascending (np.unique of small non-negative integers, by counting)."""
    return np.flatnonzero(np.bincount(order)) if order.size else order


def _balance(uniq: np.ndarray, kmin: int, kmax: int, fresh=None) -> np.ndarray:
    """The coarsest refinement of the tiling ``uniq`` that is 2:1 balanced across edges and corners.

    ``fresh``: the leaves (NUNIQ) that are new in a tiling that was balanced before them (a regrid's
    children and merged parents). Only they and the leaves touching them can be unbalanced (a leaf is,
    when a leaf two or more orders finer touches it), so only those are examined, and after each pass only
    the new children and the leaves touching them: the same tiling as examining all (the smallest balanced
    refinement is unique), for a fraction of the work."""
    uniq = _unique(np.asarray(uniq, np.int64))
    check = None if fresh is None else np.asarray(fresh, np.int64)
    while True:
        leaves = _Leaves(uniq)
        order, ipix = uniq_to_nest(uniq)
        split = np.zeros(len(uniq), bool)
        cand = np.ones(len(uniq), bool) if check is None else _touching(leaves, order, ipix, check)
        # a leaf of order k must be split if a neighbour pixel of order k + 1 around it is refined further
        # (a leaf of order >= k + 2 touches it)
        for k in _levels(order[cand]):
            if k + 2 > kmax:
                continue
            sel = np.nonzero((order == k) & cand)[0]
            kids = (ipix[sel, None] << 2) + np.arange(4)  # (n, 4) at order k + 1
            nb = hp.get_all_neighbours(1 << (k + 1), kids.ravel(), nest=True).T.reshape(len(sel), 32)
            valid = nb >= 0
            split[sel] = np.any(valid & leaves.refined(k + 1, np.where(valid, nb, 0)), axis=1)
        if not split.any():
            return uniq
        o, p = order[split], ipix[split]
        kids = nest_to_uniq(np.repeat(o + 1, 4), ((p[:, None] << 2) + np.arange(4)).ravel())
        uniq = _unique(np.concatenate([uniq[~split], kids]))
        if check is not None:
            check = kids


def _touching(leaves: "_Leaves", order: np.ndarray, ipix: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """(N,) bool: the leaves in ``fresh`` (NUNIQ) and the leaves of their order or coarser that touch one
    of them (across an edge or a corner: such a leaf holds one of its 8 neighbour pixels of its order)."""
    out = np.zeros(len(order), bool)
    fi = leaves.index(fresh)
    fi = fi[fi >= 0]
    out[fi] = True
    fo, fp = order[fi], ipix[fi]
    for k in _levels(fo):
        nb = hp.get_all_neighbours(1 << int(k), fp[fo == k], nest=True).ravel()
        nb = nb[nb >= 0]
        li = leaves.containing(np.full(nb.shape, k, np.int64), nb, up=int(k))
        out[li[li >= 0]] = True
    return out


def _leaf_or_coarser(leaves: _Leaves, order: int, ipix: np.ndarray) -> np.ndarray:
    """Leaf equal to or containing the pixels of ``order`` (any number of orders up), -1 if refined."""
    return leaves.containing(np.full(ipix.shape, order, np.int64), ipix, up=order)


#: Highest order of the pixels that :func:`attended_density` sums cells into (nside 2^ATTENDED_ORDER_MAX, 49152
#: pixels: finer cells are summed into these, so that one regrid's targets x pixels exponentials stay below
#: ~6e8 in the worst case).
ATTENDED_ORDER_MAX = 6
#: Target pixels in one block of :func:`_attended_density_dense` (its memory: BLOCK x pixels doubles).
_ATTENDED_BLOCK = 256


def attended_density(grid: "AdaptiveHealpixGrid", f, kernels, floor: float = 1e-4) -> np.ndarray:
    """The density of the attention each cell receives, sigma(y) = f(y) g(y), g(y) = int f(x) w(x, y) / Z(x) dx,
    w(x, y) = exp(beta <x, B y>), Z(x) = int f(z) w(x, z) dz: the share of the weight that the mass at x gives
    to y, summed over the mass. sigma is a probability density when f is one (int sigma = int f), it is f
    where the mass attends to itself, and it is large where a thin tail carries weight out of all proportion
    to its mass. Several kernels (heads): the largest sigma.

    An estimate for refinement, not a certified quantity: the cells are summed into pixels of order
    k = ceil(log2(1.02 beta ||B||)) (where beta ||B|| h <= 1, so w varies by at most e across one;
    clamped to the grid's orders and to ATTENDED_ORDER_MAX), each at its mass centroid; the targets x are
    the pixels holding at least ``floor`` times the heaviest pixel's mass; g is taken at a cell's pixel.
    Cost: per target, a bound for each block of 64 spatially consecutive pixels, and the exponentials of the
    blocks whose terms can matter (:func:`spherepde.kernels.attended.attended_sums`, parallel over targets;
    the terms it skips change sigma by < 1e-17 max f). :func:`_attended_density_dense` is its NumPy twin
    (targets x pixels exponentials), the reference it is tested against.
    """
    return _attended(grid, f, kernels, floor, _pruned_g)


def _attended(grid, f, kernels, floor, sums) -> np.ndarray:
    """sigma = f g for each head, the largest, with g over the pixels from ``sums(pixels)``."""
    f = np.asarray(f, float)
    mass = np.maximum(f, 0.0) * grid.areas
    best = np.zeros(grid.n_cells)
    if not mass.sum() > 0:
        return best
    for beta, B in kernels:
        pixels = _attended_pixels(grid, mass, beta, B, floor)
        if pixels is not None:
            best = np.maximum(best, f * sums(*pixels)[pixels[0]])
    return best


def _pruned_g(pix, M, Y, tgt, U, po, pi, k) -> np.ndarray:
    """g over the pixels by :func:`spherepde.kernels.attended.attended_sums`."""
    # blocks of 64 pixels consecutive in the NESTED order at order k (a pixel coarser than k at its
    # first descendant's index): compact caps, bounded from their points
    order = np.argsort(pi << (2 * (k - po)), kind="stable")
    Ys, Ms = np.ascontiguousarray(Y[order]), M[order]
    P = len(Ms)
    bstart = np.append(np.arange(0, P, 64), P).astype(np.int64)
    bc, bcr, bsr = cap_geometry(Ys, bstart)  # the attention evaluator's source blocks' caps
    with np.errstate(divide="ignore"):
        blogm = np.log(np.add.reduceat(Ms, bstart[:-1]))
    nchunk = max(1, min(len(tgt), 8 * numba.get_num_threads()))
    G = np.zeros((nchunk, P))
    _att.attended_sums(np.ascontiguousarray(U), M[tgt], Ys, Ms, bstart, bc, bcr, bsr,
                       blogm, G)
    g = np.empty(P)
    g[order] = G.sum(axis=0)
    return g


def _attended_pixels(grid, mass, beta, B, floor):
    """The pixels of :func:`attended_density` for one kernel: (cell -> pixel, pixel masses, unit mass
    centroids, target pixels, U = beta B^T x of the targets, each pixel's order and NESTED index, the order
    k), or None where beta B vanishes."""
    beta, B = float(beta), np.asarray(B, float)
    scale = beta * float(np.linalg.norm(B, 2))
    if not (np.isfinite(scale) and scale > 0):
        return None
    k = int(np.ceil(np.log2(max(1.0233 * scale, 1.0))))
    k = min(max(k, grid.order_min), grid.order_max, max(ATTENDED_ORDER_MAX, grid.order_min))
    up = np.maximum(grid.order - k, 0)
    key = nest_to_uniq(grid.order - up, grid.ipix >> (2 * up))  # the cell itself where coarser than k
    _, pix = np.unique(key, return_inverse=True)
    pix = pix.ravel()
    P = int(pix.max()) + 1
    M = np.bincount(pix, mass, P)
    # each pixel at its mass centroid, from the weights relative to its mass (a pixel of 1e-200 of the mass
    # has a centroid too); a pixel without mass sits at its area centroid
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(M[pix] > 0, mass / M[pix], grid.areas)
    Y = np.stack([np.bincount(pix, w * grid.xbar[:, d], P) for d in range(3)], axis=1)
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    tgt = np.nonzero(M >= floor * M.max())[0]
    U = beta * (Y[tgt] @ B)  # (K, 3): beta <x_k, B y> = <U_k, y>
    po = np.empty(P, np.int64)
    pi = np.empty(P, np.int64)
    po[pix] = grid.order - up
    pi[pix] = grid.ipix >> (2 * up)
    return pix, M, Y, tgt, U, po, pi, k


def _attended_density_dense(grid: "AdaptiveHealpixGrid", f, kernels, floor: float = 1e-4) -> np.ndarray:
    """:func:`attended_density` by dense NumPy sums over targets x pixels (blocks of _ATTENDED_BLOCK targets):
    its twin and reference (every term, to underflow)."""
    return _attended(grid, f, kernels, floor, _dense_g)


def _dense_g(pix, M, Y, tgt, U, *_) -> np.ndarray:
    """g over the pixels by dense sums (every target x every pixel)."""
    g = np.zeros(len(M))
    for a in range(0, len(tgt), _ATTENDED_BLOCK):
        E = U[a:a + _ATTENDED_BLOCK] @ Y.T  # (b, P)
        E -= E.max(axis=1, keepdims=True)
        np.exp(E, out=E)
        Z = E @ M  # Z(x_k) e^-max_k
        g += (M[tgt[a:a + _ATTENDED_BLOCK]] / Z) @ E
    return g


@dataclass(frozen=True)
class Refinement:
    """When an :class:`AdaptiveHealpixGrid` refines and coarsens (during a run, every ``interval`` CFL steps).

    With h_i = sqrt(|C_i|) the cell's size, the variation r_i = (max - min) / max of f over the cell and
    the cells touching it, and "significant" meaning f >= ``floor`` max f somewhere in that stencil:

    - **refine** where r_i > ``variation`` (and significant): a feature (a cluster, a front) is not resolved;
      or where h_i beta ||B|| > ``attention`` (and f_i significant): the attention weights vary by more than
      exp(``attention``) across the cell (:func:`spherepde.models.terms.attention_scale`), then ``buffer``
      rings of touching cells around every refined cell (features move between regrids);
    - **coarsen** four siblings where all are negligible (their stencils below the floor), or all smooth
      (r_i < ``coarsen`` x ``variation`` and 2 h_i beta ||B|| <= ``attention``: the parent would not be
      refined again at once), never within the buffer of a refined cell.

    With ``attention_variation`` > 0 the attention criterion applies only where the density also varies,
    r_i > ``attention_variation`` (and a smooth cell may be coarsened past it where 2 r_i <=
    ``attention_variation``). Where f is smooth on the cell scale the field's cell sums are accurate even
    when the weights vary by exp(h beta ||B||) across a cell (the midpoint errors of a smooth integrand
    cancel over the sphere: Figure 4's uniform f0 at beta 100 concentrates at the same rate, to 0.06 %, on
    nside 64 cells, h beta = 1.6, as on 128 and 256), and a near-uniform early density at large beta is
    then not refined everywhere to h < ``attention`` / (beta ||B||) (nside 256 at beta 100, 2048 at beta
    1000). Default 0: the attention criterion wherever the cell holds significant mass.

    With ``attended=True`` a cell also counts as significant where the density of the attention it receives,
    sigma(y) = f(y) int f(x) w(x, y) / Z(x) dx with w = exp(beta <x, B y>) and Z(x) = int f w(x, .) (a
    probability density like f: :func:`attended_density`), reaches the floor: the thin tails that the
    exponential weights raise above the clusters (a cell holding 1e-11 of the mass can carry a third of the
    weight at a cluster of beta = 30, ``validation/fig4_concentration``) are then refined and kept like mass,
    not coarsened as negligible.

    Parameters
    ----------
    variation : float, default 0.25
    attention : float, default 0.5
    floor : float, default 1e-4
        Relative to max f: below it a cell is negligible (it is coarsened, never refined).
    coarsen : float, default 0.25
    buffer : int, default 2
    interval : int, default 4
        CFL steps between regrids: steps of SSP-RK3, SSP-RK2 or Euler; a stepper of SSP coefficient c
        (SSP-RK(4,3): 2), whose steps are c times as long, regrids every interval / c steps. At CFL 0.4 a
        feature moves at most 1.6 cells in 4 CFL steps, within a buffer of 2 rings. A step shorter than
        the CFL step (or than ``max_dt``, where that is shorter), as the error control takes them, counts
        as its fraction of one: the regrids follow the distance the density moved, not the step count
        (``Solver._maybe_regrid``).
    attended : bool, default False
        Count the attention a cell receives as well as its density (above); the grid needs the model's
        attention kernels, which the solver hands to :meth:`AdaptiveHealpixGrid.regrid`.
    attention_variation : float, default 0
        The attention criterion only where r_i exceeds it (above); 0: wherever f is significant.
    attended_floor : float, optional
        Relative to max f, the sigma from which a cell counts as significant under ``attended`` (default:
        ``floor``). A tail's weight grows like exp(beta <x, B y>) long before it holds the field, and its
        history is resolved only if it is refined while its sigma is far below the mass floor: at Figure 4's
        beta = 30 the tails that later carry a third of the weight sit at sigma ~ 1e-8 to 1e-6 of max f at
        t = 5-14 (``validation/fig4_concentration``, README "The attended refinement").
    """

    variation: float = 0.25
    attention: float = 0.5
    floor: float = 1e-4
    coarsen: float = 0.25
    buffer: int = 2
    interval: int = 4
    attended: bool = False
    attended_floor: float | None = None
    attention_variation: float = 0.0

    def __post_init__(self):
        for name in ("variation", "attention", "floor", "coarsen", "attention_variation"):
            object.__setattr__(self, name, finite_float(getattr(self, name), f"Refinement.{name}", low=0.0))
        if not (self.variation > 0 and self.coarsen < 1):
            raise ValueError(f"Refinement.variation must be > 0 and coarsen < 1, got {self.variation}, {self.coarsen}")
        object.__setattr__(self, "buffer", positive_int(self.buffer, "Refinement.buffer", minimum=0))
        object.__setattr__(self, "interval", positive_int(self.interval, "Refinement.interval", minimum=0))
        if not isinstance(self.attended, (bool, np.bool_)):
            raise TypeError(f"Refinement.attended must be True or False, got {self.attended!r}")
        object.__setattr__(self, "attended", bool(self.attended))
        if self.attended_floor is not None:
            object.__setattr__(self, "attended_floor",
                               finite_float(self.attended_floor, "Refinement.attended_floor", low=0.0))

    def flags(self, grid: "AdaptiveHealpixGrid", f, scale: float = 0.0, kernels=()):
        """(refine, coarsen) boolean arrays over the cells of ``grid`` for the density ``f``; ``kernels``:
        the model's attention kernels ``[(beta, B), ...]`` (:func:`spherepde.models.terms.attention_kernels`),
        which ``attended`` needs."""
        f = np.asarray(f, float)
        nb = f[grid.stencil]  # (N, S): the stencil pads with the cell itself
        hi = np.maximum(nb.max(axis=1), f)
        lo = np.minimum(nb.min(axis=1), f)
        fmax = float(f.max())
        floor = self.floor * fmax
        with np.errstate(divide="ignore", invalid="ignore"):
            var = np.where(hi > 0, (hi - lo) / hi, 0.0)
        significant = hi >= floor if fmax > 0 else np.zeros(grid.n_cells, bool)
        holds = f >= floor
        if self.attended and kernels and fmax > 0 and not significant.all():
            sigma = attended_density(grid, f, kernels, self.floor)
            sfloor = (self.floor if self.attended_floor is None else self.attended_floor) * fmax
            holds |= sigma >= sfloor
            significant |= np.maximum(sigma[grid.stencil].max(axis=1), sigma) >= sfloor
        h = np.sqrt(grid.areas)
        att = h * scale
        refine = significant & (var > self.variation)
        if scale > 0:
            varies = (var > self.attention_variation) if self.attention_variation > 0 else True
            refine |= holds & (att > self.attention) & (fmax > 0) & varies
        near = refine.copy()
        for _ in range(self.buffer):
            near |= near[grid.stencil].any(axis=1)
        refine = near & (grid.order < grid.order_max)
        negligible = ~significant
        smooth = (var < self.coarsen * self.variation) & ((2.0 * att <= self.attention)
                                                          | (2.0 * var <= self.attention_variation))
        coarsen = ~near & (negligible | smooth)
        return refine, coarsen


class AdaptiveHealpixGrid(Grid):
    """HEALPix cells of mixed orders between ``nside_min`` and ``nside_max`` (a 2:1 balanced quadtree forest).

    Parameters
    ----------
    nside_min, nside_max : int
        Powers of 2, ``nside_min <= nside_max``: the coarsest and the finest cells allowed.
    uniq : array of int, optional
        The cells as NUNIQ indices (a complete tiling of the sphere with orders in the allowed range);
        default: the uniform grid at ``nside_min``. The tiling is refined to 2:1 balance (edges and
        corners) if it is not balanced.
    edge_points, cell_order : int
        As for :class:`~spherepde.grids.healpix.HealpixGrid` (Gauss points per edge, cell quadrature).
    max_cells : int, optional
        Refinement (:meth:`adapt`, :meth:`refined_where`) raises ValueError naming ``max_cells`` rather than
        exceed it.
    refinement : Refinement or False, optional
        How the grid adapts in a run (default ``Refinement()``): refined on a callable initial density before
        the run, then regridded every ``refinement.interval`` steps. ``False``: the cells stay as given (a
        static patch).

    Attributes
    ----------
    uniq : (N,) NUNIQ of each cell; order : (N,) its order; ipix : (N,) its NESTED index at that order.
    nside : (N,) the nside of each cell's order (2^order). The arrays of :class:`~spherepde.grids.base.Grid`.
    """

    dim = 3

    def __init__(self, nside_min: int, nside_max: int, uniq=None, *, edge_points: int = 6, cell_order: int = 4,
                 max_cells: int | None = None, refinement: Refinement | None = None, _reuse=None,
                 _balanced: bool = False):
        kmin, kmax = _order_of(nside_min, "nside_min"), _order_of(nside_max, "nside_max")
        if kmin > kmax:
            raise ValueError(f"nside_min ({nside_min}) must be <= nside_max ({nside_max})")
        self.nside_min, self.nside_max = 1 << kmin, 1 << kmax
        self.order_min, self.order_max = kmin, kmax
        self.edge_points = positive_int(edge_points, "edge_points", minimum=1)
        self.cell_order = positive_int(cell_order, "cell_order", minimum=1)
        self.max_cells = None if max_cells is None else positive_int(max_cells, "max_cells", minimum=12)
        self.refinement = Refinement() if refinement is None else refinement
        if self.refinement is not False and not isinstance(self.refinement, Refinement):
            raise TypeError(f"refinement must be a spherepde.grids.adaptive.Refinement or False (the cells stay as "
                            f"given), got {type(self.refinement).__name__}")
        self.regrid_interval = self.refinement.interval if (self.refinement and kmax > kmin) else 0
        if uniq is None:
            uniq = nest_to_uniq(kmin, np.arange(12 << (2 * kmin)))
        uniq = np.asarray(uniq)
        if uniq.ndim != 1 or not np.issubdtype(uniq.dtype, np.integer) or uniq.size == 0:
            raise ValueError("uniq must be a non-empty 1-d array of integer NUNIQ indices")
        order, _ = uniq_to_nest(uniq)
        if order.min() < kmin or order.max() > kmax:
            raise ValueError(f"uniq holds cells of orders {int(order.min())}..{int(order.max())}; the allowed "
                             f"orders are {kmin}..{kmax} (nside_min {self.nside_min}, nside_max {self.nside_max})")
        if not _balanced:  # (adapt hands over a balanced tiling; given cells are checked and balanced here)
            _check_tiling(uniq)
            uniq = _balance(uniq, kmin, kmax)
        self._check_size(len(uniq))
        order, ipix = uniq_to_nest(uniq)
        # Morton order of the finest level: the first descendant at order kmax
        key = ipix << (2 * (kmax - order))
        perm = np.argsort(key, kind="stable")
        self.uniq, self.order, self.ipix = uniq[perm], order[perm], ipix[perm]
        self._leaves = _Leaves(self.uniq)
        self._token = secrets.randbits(63)  # names this grid to one adapted from it (kept_faces)
        self.nside = (np.int64(1) << self.order)
        N = len(self.uniq)
        # geometry of the cells and faces that the grid this one was adapted from already has is copied
        # (a regrid changes few cells; the rest is bit-identical work)
        if _reuse is not None and (_reuse.edge_points, _reuse.cell_order) != (self.edge_points, self.cell_order):
            _reuse = None
        old = _reuse._leaves.index(self.uniq) if _reuse is not None else np.full(N, -1)
        have = old >= 0
        new = ~have
        ix, iy, face = np.empty(N, np.int64), np.empty(N, np.int64), np.empty(N, np.int64)
        centers = np.empty((N, 3))
        for k in _levels(self.order):
            sel = self.order == k
            ix[sel], iy[sel], face[sel] = hp.pix2xyf(1 << int(k), self.ipix[sel], nest=True)
        self._face = face
        self._h = 1.0 / self.nside.astype(float)
        self._x0, self._y0 = ix * self._h, iy * self._h
        self.areas = FACE_AREA * self._h ** 2  # the face map is equal-area
        # the cell quadrature (N x 32 points at cell_order 4: 113 MB at 147k cells) is not kept: the mean
        # positions of the cells kept are copied, the new cells' computed from their own points, and
        # ``cell_points`` is made when asked for (initial averages, second moments). Copying the points at
        # every regrid was about a fifth of adapt()'s time at 147k cells (0.58 -> 0.47 s).
        xbar = np.empty((N, 3))
        if have.any():
            centers[have] = _reuse.centers[old[have]]
            xbar[have] = _reuse.xbar[old[have]]
        for k in _levels(self.order[new]):
            sel = new & (self.order == k)
            centers[sel] = np.array(hp.pix2vec(1 << int(k), self.ipix[sel], nest=True)).T
        if new.any():
            pts, self.cell_weights = _square_rule(self.cell_order, face[new], self._x0[new], self._y0[new],
                                                  self._h[new])
            xbar[new] = np.einsum("nqd,q->nd", pts, self.cell_weights)  # row by row: the bits of the full array's
            del pts
        else:
            self.cell_weights = _reuse.cell_weights
        self._cell_points = None
        self.centers = centers
        # a cell whose stencil is the same cells as in the grid adapted from (``same``) keeps its coefficients
        # and its faces
        # each cell of _reuse's index here (-1: gone; one slot more, -1, for a stencil's padding)
        old2new = None
        if _reuse is not None:
            old2new = np.full(_reuse.n_cells + 1, -1, np.int64)
            old2new[old[have]] = np.nonzero(have)[0]
        nbrs, same = self._stencil_neighbours(_reuse, old, old2new)
        self._build_faces(_reuse, old, same, old2new)
        self.xbar = xbar
        self.stencil = np.where(nbrs >= 0, nbrs, np.arange(N)[:, None]).astype(np.int32)
        self._same_stencil = same  # (kept_stencils: the cells whose gradient is the grid adapted from's)
        self.tangent_basis = tangent_frames(self.xbar)
        # whole rows taken in order, the rows not the same made below (a masked gather and scatter of these
        # 35 MB at 181k cells was 0.1 s of a regrid)
        take = np.where(same, old, 0)  # each cell's row in _reuse's arrays where its stencil is the same
        self.stencil_coef_local = (take_rows(_reuse.stencil_coef_local, take)
                                   if same.any() else np.zeros((N, STENCIL_WIDTH, 2)))
        # the ambient coefficients of those cells (stencil_coef), where the grid adapted from has made them:
        # the same local rows and frames (xbar copied), so the same bits; made when first asked for
        prev = _reuse.__dict__.get("stencil_coef") if _reuse is not None and same.any() else None
        self._coef_from = None if prev is None else (prev, take, same)
        # the class hashes of the kept rows (stencil_classes), where the grid adapted from has made them
        hashed = _reuse.__dict__.get("_class_hash_rows") if _reuse is not None and same.any() else None
        self._classes_from = None if hashed is None else (hashed, take, same)
        rows = np.nonzero(~same)[0]
        if rows.size:
            self.stencil_coef_local[rows] = least_squares_stencil(self.xbar, nbrs[rows], self.tangent_basis[rows],
                                                                  rows=rows)[0]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_coef_from"] = None  # a pickled grid makes its stencil_coef afresh (the same bits), not from a copy
        state["_classes_from"] = None
        return state

    @cached_property
    def stencil_coef(self) -> np.ndarray:
        """:attr:`Grid.stencil_coef`, with the rows of the cells whose stencil and frame a regrid kept copied
        from the grid adapted from (a regrid keeps most cells: ~5 % of the nside_max 2048 transition-law
        member's time went to remaking every row); the others made as there, row by row (the same bits)."""
        src, self._coef_from = getattr(self, "_coef_from", None), None  # (the old array is not kept)
        if src is None:
            return ambient_coef(self.stencil_coef_local, self.tangent_basis)
        prev, take, same = src
        out = take_rows(prev, take)  # whole rows in order; the rows not the same made below
        rest = ~same
        if rest.any():
            out[rest] = ambient_coef(self.stencil_coef_local[rest], self.tangent_basis[rest])
        return out

    @cached_property
    def stencil_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`Grid.stencil_classes`, with the hashes of the rows a regrid kept taken from the grid adapted
        from (the same bits as hashing all: the classes are the same)."""
        src, self._classes_from = getattr(self, "_classes_from", None), None
        known = None if src is None else (src[0][0], np.take(src[0][1], src[1]), src[2])
        cls, table, scale, h = _stencil_classes(self.stencil_coef_local, known=known)
        self._class_hash_rows = (scale, h)
        return cls, table

    @property
    def cell_points(self) -> np.ndarray:
        """The cell quadrature's points (N, 2 cell_order^2, 3), with ``cell_weights``; made on first use."""
        if self._cell_points is None:
            self._cell_points = _square_rule(self.cell_order, self._face, self._x0, self._y0, self._h)[0]
        return self._cell_points

    def __repr__(self):
        counts = np.bincount(self.order, minlength=self.order_max + 1)[self.order_min:]
        levels = ", ".join(f"{1 << (self.order_min + i)}: {c}" for i, c in enumerate(counts) if c)
        return (f"AdaptiveHealpixGrid(nside_min={self.nside_min}, nside_max={self.nside_max}, "
                f"n_cells={self.n_cells}; cells per nside {{{levels}}})")

    def _check_size(self, n: int):
        if self.max_cells is not None and n > self.max_cells:
            raise ValueError(f"the refined grid would have {n} cells, more than max_cells = {self.max_cells}: "
                             "raise max_cells, lower nside_max or refine less")

    # ------------------------------------------------------------------ faces
    def _build_faces(self, reuse=None, old=None, same=None, old2new=None):
        """The faces: each cell's edges towards a leaf of its order (once, from the cell first in the cell
        order) or one order coarser (from this, the fine, side); a refined neighbour's children build the
        sub-faces. Faces in cell order (owner, then neighbour: the pairs are distinct), for locality in the
        kernels.

        With the grid ``reuse`` this one was adapted from, ``old`` (each cell's index there, -1 if new),
        ``old2new`` (its inverse) and ``same`` (the cells whose stencil is the same leaves there, :meth:`_stencil_neighbours`): a cell whose
        stencil is the same owns the same faces (its edge neighbours are leaves of that stencil), which are
        ``reuse``'s renumbered, geometry and all; only the other cells' faces are searched, and matched to
        ``reuse``'s faces through their owner's list there (a regrid changes ~2 % of the cells: the search
        over all of them, the matching of every face key by a sort and the face sort were ~0.1 s of a regrid
        at 181k cells)."""
        N = self.n_cells
        if reuse is None:
            old, same = np.full(N, -1, np.int64), np.zeros(N, bool)
        kept = np.zeros(0, np.int64)  # reuse's faces that cells with the same stencil own
        if same.any():
            owns = np.zeros(reuse.n_cells, bool)
            owns[old[same]] = True
            kept = np.nonzero(owns[reuse.owner])[0]
        owner, neigh, edge = self._face_lists(np.nonzero(~same)[0])
        if kept.size:  # (in reuse's face order, which the renumbering keeps: a stable sort merges two runs)
            n_new = old2new[reuse.neighbour[kept]]
            if np.any(n_new < 0):  # pragma: no cover - the stencil holds every edge neighbour
                raise RuntimeError("a face of a cell with the same stencil lost its neighbour")
            owner = np.concatenate([old2new[reuse.owner[kept]], owner])
            neigh = np.concatenate([n_new, neigh])
            edge = np.concatenate([(reuse._face_key[kept] % 4).astype(np.int8), edge])
        order = np.argsort(owner * N + neigh, kind="stable")
        owner, neigh, edge = owner[order], neigh[order], edge[order]
        self.owner, self.neighbour = owner.astype(np.int32), neigh.astype(np.int32)
        # a face's geometry is that of edge `edge` of its owner (the fine side): keyed by (owner NUNIQ, edge)
        self._face_key = self.uniq[owner] * 4 + edge
        F, G = len(owner), self.edge_points
        known = None
        if reuse is None:
            arrays = (np.empty((F, G, 3)), np.empty((F, G, 3)), np.empty((F, 3)), np.empty((F, 2, 3)))
            todo = np.ones(F, bool)
        else:
            src = np.full(F, -1, np.int64)  # reuse's face of the same key (owner NUNIQ, edge), -1 if none
            pos = np.empty(F, np.int64)
            pos[order] = np.arange(F)
            src[pos[:kept.size]] = kept
            # a searched face's owner, if kept, owns the face of the same key in reuse too: the one of its
            # owned faces there (sign +1) on the same edge
            rows = np.nonzero(src < 0)[0]
            o = old[owner[rows]]
            rows, o = rows[o >= 0], o[o >= 0]
            cand = reuse.cell_faces[o]
            match = (reuse.cell_face_sign[o] == 1) & (reuse._face_key[cand] % 4 == edge[rows, None])
            found = match.any(axis=1)
            src[rows[found]] = cand[found, np.argmax(match[found], axis=1)]
            hit = src >= 0
            src = np.maximum(src, 0)
            # every row gathered, whole rows in order (a masked gather and scatter was slower); the rows
            # that missed are made below
            arrays = tuple(take_rows(b, src) for b in (reuse.face_points, reuse.face_normals,
                                                             reuse._face_mid, reuse.face_ends))
            todo = ~hit
            rows = np.nonzero(hit)[0]
            known = (rows, reuse.face_length[src[rows]], reuse.face_unit_normal[src[rows]])
        # the faces whose geometry was copied from ``reuse``, for kept_faces
        self._faces_from = None if reuse is None else (getattr(reuse, "_token", None), rows, src[rows])
        for j, (_, fixed, off) in enumerate(_EDGES):
            sel = np.nonzero(todo & (edge == j))[0]
            if not len(sel):
                continue
            p = owner[sel]
            part = edge_quadrature(self._face[p], self._x0[p], self._y0[p], self._h[p], fixed, off,
                                   self.edge_points, self.centers[p])
            for a, b in zip(arrays, part):
                a[sel] = b
        self._face_mid = arrays[2]
        _set_faces(self, [arrays], known)
        self.cell_faces, self.cell_face_sign, count = incidence(self.owner, self.neighbour, N, FACE_WIDTH)
        if np.any(count < 4):  # pragma: no cover - a broken tiling
            raise RuntimeError("every cell of an adaptive HEALPix grid has at least four faces")

    def _face_lists(self, cells):
        """(owner, neighbour, edge) of the faces the cells ``cells`` (ascending) own, in no particular order."""
        owners, neighs, edges = [], [], []
        for k in _levels(self.order[cells]):
            sel = cells[self.order[cells] == k]
            nb = hp.get_all_neighbours(1 << int(k), self.ipix[sel], nest=True)  # (8, n)
            for j, (e, _, _) in enumerate(_EDGES):
                q = nb[e]
                if np.any(q < 0):  # pragma: no cover - healpy guarantees edge neighbours exist
                    raise RuntimeError("HEALPix edge neighbour missing")
                leaf = self._leaves.containing(np.full(q.shape, k), q, up=1)  # equal, or the parent
                lo = self.order[np.maximum(leaf, 0)]
                same = np.where((leaf >= 0) & (lo == k), leaf, -1)
                coarse = np.where((leaf >= 0) & (lo == k - 1), leaf, -1)
                # same order: once, from the cell first in the cell order; coarser neighbour: from this
                # (the fine) side; a refined neighbour's children build the sub-faces
                emit_same = (same >= 0) & (sel < same)
                emit_coarse = (same < 0) & (coarse >= 0)
                pick = emit_same | emit_coarse
                owners.append(sel[pick])
                neighs.append(np.where(emit_same, same, coarse)[pick])
                edges.append(np.full(int(pick.sum()), j, np.int8))
        cat = lambda parts, dtype: np.concatenate(parts) if parts else np.zeros(0, dtype)  # noqa: E731
        return cat(owners, np.int64), cat(neighs, np.int64), cat(edges, np.int8)

    def _stencil_neighbours(self, reuse=None, old=None, old2new=None):
        """(nbrs, same): (N, STENCIL_WIDTH) the leaves touching each cell (edges and corners), -1 padded,
        sorted by index, and (N,) bool, the cells whose stencil is the same leaves as in ``reuse``.

        With the grid ``reuse`` this one was adapted from (``old``: each cell's index there, -1 if new;
        ``old2new``: its inverse, with a last slot -1): a
        kept cell all of whose old stencil leaves are still leaves has the same stencil (those leaves tile
        the ring around it, so no new leaf can touch it), renumbered; only the others are searched (a
        regrid changes few cells: the search was 37 % of a regrid at 150k cells), and their stencils are
        not the same (one of their old leaves is gone)."""
        N = self.n_cells
        out = np.full((N, STENCIL_WIDTH), -1, np.int64)
        cells = np.arange(N)
        todo = np.ones(N, bool)
        if reuse is not None and np.any(old >= 0):
            rows = np.nonzero(old >= 0)[0]
            # the old stencils in old indices, renumbered through the kept cells (-1: gone or padding, which
            # is the cell itself in ``stencil``); both grids number their cells in the Morton order of the
            # finest level, so the renumbering keeps each row's order (ascending, -1 last)
            prev = reuse.stencil[old[rows]]
            prev = np.where(prev != old[rows, None], prev, reuse.n_cells)
            idx = old2new[prev]
            ok = np.all((prev == reuse.n_cells) | (idx >= 0), axis=1)
            out[rows[ok]] = idx[ok]
            todo[rows[ok]] = False
        for k in _levels(self.order[todo]):
            sel = cells[(self.order == k) & todo]
            kids = (self.ipix[sel, None] << 2) + np.arange(4)
            nb = hp.get_all_neighbours(1 << (int(k) + 1), kids.ravel(), nest=True).T.reshape(len(sel), 32)
            leaf = _leaf_or_coarser(self._leaves, int(k) + 1, np.where(nb >= 0, nb, 0))
            leaf = np.where((nb >= 0) & (leaf != sel[:, None]), leaf, -1)
            if np.any((nb >= 0) & (leaf < 0) & (np.where(nb >= 0, nb, 0) >> 2 != self.ipix[sel, None])):
                raise RuntimeError("the tiling is not 2:1 balanced across corners")  # pragma: no cover
            # unique per row, -1 last
            srt = np.sort(np.where(leaf >= 0, leaf, np.iinfo(np.int64).max), axis=1)
            dup = np.zeros_like(srt, bool)
            dup[:, 1:] = srt[:, 1:] == srt[:, :-1]
            srt = np.where(dup, np.iinfo(np.int64).max, srt)
            srt = np.sort(srt, axis=1)[:, :STENCIL_WIDTH]
            out[sel] = np.where(srt == np.iinfo(np.int64).max, -1, srt)
        return out, ~todo

    @cached_property
    def kernel_split(self):
        """(small, large) int32 cell lists of the stage kernel (:func:`~spherepde.kernels.fv.stage_update_compact`):
        the cells with at most 8 stencil cells and 4 faces (inside a patch of one order; their padding is
        last in their rows) and the others. The kernel is written for rows of 12 and 8 slots and frames of
        2 components (S^2): None for any other shape."""
        N = self.n_cells
        if (self.stencil.shape[1], self.cell_faces.shape[1], self.dim) != (STENCIL_WIDTH, FACE_WIDTH, 3):
            return None  # pragma: no cover - the widths are the module's constants
        ns = np.count_nonzero(self.stencil != np.arange(N)[:, None], axis=1)
        nf = np.count_nonzero(self.cell_face_sign, axis=1)
        small = (ns <= 8) & (nf <= 4)
        return np.nonzero(small)[0].astype(np.int32), np.nonzero(~small)[0].astype(np.int32)

    @cached_property
    def kernel_compact(self):
        """What :func:`~spherepde.kernels.fv.stage_update_compact` reads besides the padded rows, for the
        cells of :attr:`kernel_split`: (stencil4 (N, 8) the first 8 stencil offsets, in4 (N, 4) and
        in_large (len(large), 8) the absolute positions of the inflow through each face slot in the compact
        outflow layout (slot k < 4 of cell c at 4 c + k, slot k >= 4 of the j-th large cell at 4 N + 4 j +
        k - 4; a padding slot points at its own), the outflow array's length); None where there is no split."""
        split = self.kernel_split
        if split is None:
            return None  # pragma: no cover - the widths are the module's constants
        small, large = split
        N, K = self.cell_faces.shape
        lidx = np.full(N, -1, np.int64)
        lidx[large] = np.arange(len(large))
        flat = self.cell_inflow.astype(np.int64)  # j * K + k' in the padded layout
        nb, slot = flat // K, flat % K
        pos = np.where(slot < 4, 4 * nb + slot, 4 * N + 4 * lidx[nb] + slot - 4)
        if np.any(pos < 0):  # pragma: no cover - a slot >= 4 only exists in a large cell
            raise RuntimeError("a face slot beyond the fourth belongs to a cell outside the large list")
        stencil4 = np.ascontiguousarray(self.stencil_offsets[:, :8])
        in4 = np.ascontiguousarray(pos[:, :4]).astype(np.int32)
        in_large = np.ascontiguousarray(pos[large]).astype(np.int32)
        return stencil4, in4, in_large, 4 * N + 4 * len(large)

    @cached_property
    def error_blocks(self) -> np.ndarray:
        """Blocks of sibling cells (the four children of one parent; see :attr:`Grid.error_blocks`): the
        parent's NUNIQ, numbered; cells of order ``nside_min``'s order 0 are their own block."""
        parent = np.where(self.order > 0, nest_to_uniq(np.maximum(self.order - 1, 0), self.ipix >> 2), -self.uniq)
        # np.unique's inverse by a stable sort (runs of ascending parents in the cell order: 14 -> ~3 ms at 181k
        # cells, once per regrid)
        perm = np.argsort(parent, kind="stable")
        srt = parent[perm]
        rank = np.cumsum(np.concatenate(([False], srt[1:] != srt[:-1])))
        out = np.empty(self.n_cells, np.int64)
        out[perm] = rank
        return out

    # ------------------------------------------------------------ refinement
    def adapt(self, refine=None, coarsen=None) -> "AdaptiveHealpixGrid":
        """A new grid with the cells flagged in ``refine`` split into their four children (up to
        ``nside_max``) and each set of four siblings all flagged in ``coarsen`` (and not in ``refine``)
        merged into their parent (down to ``nside_min``), then 2:1 balanced (balance wins over coarsening).

        ``refine`` and ``coarsen`` are boolean arrays of length ``n_cells`` or arrays of cell indices.
        """
        N = self.n_cells
        ref = _mask(refine, N, "refine") & (self.order < self.order_max)
        crs = _mask(coarsen, N, "coarsen") & ~ref & (self.order > self.order_min)
        uniq = self.uniq
        # coarsening: a parent all of whose four children are leaves flagged for coarsening. Four sibling leaves
        # are consecutive in the cell order (Morton): the first child and the cell three on are siblings iff
        # the two between are the other two, as leaves
        parent = nest_to_uniq(np.maximum(self.order - 1, 0), self.ipix >> 2)
        first = np.nonzero(crs[:max(N - 3, 0)] & ((self.ipix[:max(N - 3, 0)] & 3) == 0))[0]
        first = first[crs[first + 1] & crs[first + 2] & crs[first + 3] & (parent[first + 3] == parent[first])]
        merged = parent[first]
        gone = np.zeros(N, bool)
        for j in range(4):
            gone[first + j] = True
        o, p = self.order[ref], self.ipix[ref]
        kids = nest_to_uniq(np.repeat(o + 1, 4), ((p[:, None] << 2) + np.arange(4)).ravel())
        new = np.concatenate([uniq[~ref & ~gone], kids, merged])
        # (the constructor checks max_cells)
        return self._with(_balance(new, self.order_min, self.order_max, fresh=np.concatenate([kids, merged])))

    def _with(self, uniq, balanced: bool = True) -> "AdaptiveHealpixGrid":
        """The grid of the cells ``uniq`` (``self`` if they are this grid's), reusing this grid's geometry;
        ``balanced=False``: cells not known to tile the sphere 2:1 balanced, checked and balanced first."""
        uniq = np.asarray(uniq, np.int64)
        srt = lambda a: np.sort(a, kind="stable")  # noqa: E731 (ascending runs: merged, not sorted anew)
        if len(uniq) == self.n_cells and np.array_equal(srt(uniq), srt(self.uniq)):
            return self
        return AdaptiveHealpixGrid(self.nside_min, self.nside_max, uniq, edge_points=self.edge_points,
                                   cell_order=self.cell_order, max_cells=self.max_cells, refinement=self.refinement,
                                   _reuse=self, _balanced=balanced)

    # ------------------------------------------------------------ the grid contract of a changing grid
    def initial(self, f0, attention_scale: float = 0.0, kernels=()) -> "AdaptiveHealpixGrid":
        """Refine on the initial density ``f0(x)`` by the :attr:`refinement` criteria, from this grid, until
        they ask for nothing more (refinement only; the averages are recomputed from ``f0`` on every pass,
        so a narrow feature's mass is integrated on its fine cells). Features narrower than the quadrature
        nodes of a coarse cell are found when ``f0`` declares them, ``f0.features = [(point, width), ...]``
        (adaptive quadrature, :meth:`cell_average` with ``features``)."""
        grid = self
        if not self.refinement:
            return grid
        feats = getattr(f0, "features", None) or None
        for _ in range(self.order_max - self.order_min + 1):
            if feats:  # declared narrow features (f0.features): adaptive averages, which cannot miss them
                f = np.maximum(grid.cell_average(f0, rtol=1e-10, features=feats), 0.0)
            else:
                f = np.maximum(grid.cell_average(f0), 0.0)
            ref, _ = grid.refinement.flags(grid, f, attention_scale, kernels)
            if not ref.any():
                break
            grid = grid.adapt(refine=ref)
        return grid

    def regrid(self, f, attention_scale: float = 0.0, quadratic: bool = False, kernels=()):
        """``(new grid, f transferred)`` by the :attr:`refinement` criteria, None when the cells stay;
        ``quadratic``: the transfer with the quadratic reconstruction (:func:`transfer`); ``kernels``: the
        model's attention kernels (for ``Refinement.attended``)."""
        if not self.refinement:
            return None
        ref, crs = self.refinement.flags(self, f, attention_scale, kernels)
        if not ref.any() and not crs.any():
            return None
        new = self.adapt(refine=ref, coarsen=crs)
        if new is self:
            return None
        return new, transfer(f, self, new, quadratic)

    def move_field(self, values, target: "AdaptiveHealpixGrid") -> np.ndarray:
        """Cell-centre values (N, ...) of a smooth field on ``target`` (another tiling of the forest), each
        component as :func:`transfer` moves a density: cells kept keep their values, refined cells take
        the limited linear reconstruction of their parent, coarsened ones the area-weighted mean of their
        children: second order for a smooth field whose values stand at the cell mean positions ``xbar``, as
        the solver's interpolation of the attention mean to the faces takes them."""
        values = np.asarray(values, float)
        if target is self:
            return values
        out = transfer(values.reshape(self.n_cells, -1), self, target)
        return out.reshape((target.n_cells,) + values.shape[1:])

    def kept_cells(self, old: "AdaptiveHealpixGrid") -> np.ndarray:
        """Boolean (N,): the cells of this tiling that are leaves of ``old`` too (the same NUNIQ): those
        :meth:`move_field` and :func:`transfer` keep as they were."""
        if old is self:
            return np.ones(self.n_cells, bool)
        return old._leaves.index(self.uniq) >= 0

    def kept_faces(self, old: "AdaptiveHealpixGrid"):
        """The faces of this tiling that ``old`` has too (the same fine-side cell and edge: ``_face_key``) whose
        quadrature points and normals are the same bits there; see :meth:`Grid.kept_faces`. When this grid was
        adapted from ``old`` (:meth:`adapt`) those are the faces whose geometry it copied from it, recorded
        then; otherwise the keys are matched and the geometry compared."""
        if old is self:
            return super().kept_faces(old)
        if self._adapted_from(old):
            return self._faces_from[1], self._faces_from[2]  # these faces' geometry was copied from ``old``
        if not isinstance(old, AdaptiveHealpixGrid) or old.n_faces == 0 or \
                old.face_points.shape[1:] != self.face_points.shape[1:]:
            return None
        srt = np.argsort(old._face_key)
        pos = np.minimum(np.searchsorted(old._face_key[srt], self._face_key), len(srt) - 1)
        src = srt[pos]
        rows = np.flatnonzero(old._face_key[src] == self._face_key)
        src = src[rows]
        same = (np.all(old.face_points[src] == self.face_points[rows], axis=(1, 2))
                & np.all(old.face_normals[src] == self.face_normals[rows], axis=(1, 2)))
        return rows[same], src[same]

    def kept_stencils(self, old: "AdaptiveHealpixGrid"):
        """:meth:`Grid.kept_stencils`: when this grid was adapted from ``old`` (:meth:`adapt`), the cells that
        kept their stencil (the same leaves, so the same coefficients, copied, and the same mean position);
        None for any other ``old``."""
        if old is self:
            return super().kept_stencils(old)
        return self._same_stencil if self._adapted_from(old) else None

    def _adapted_from(self, old) -> bool:
        """Whether this grid was adapted from ``old`` (:meth:`adapt`, which records ``old``'s token with the
        faces it copied)."""
        mine = getattr(self, "_faces_from", None)
        return mine is not None and mine[0] is not None and mine[0] == getattr(old, "_token", None)

    def cells_state(self) -> dict:
        return {"uniq": self.uniq.copy()}

    @staticmethod
    def cell_areas(uniq) -> np.ndarray:
        """The areas of the NUNIQ cells ``uniq`` in the order given, FACE_AREA / nside^2 (the face map is
        equal-area): a grid's ``areas`` bit for bit, without building the grid (a saved state's mass)."""
        order, _ = uniq_to_nest(np.asarray(uniq, np.int64))
        return FACE_AREA * (1.0 / (np.int64(1) << order).astype(float)) ** 2

    def with_cells(self, state: dict) -> "AdaptiveHealpixGrid":
        """The grid of a checkpoint's or a saved state's cells ``state["uniq"]``, checked as the constructor
        checks given cells (orders in range, a tiling of the sphere, 2:1 balanced), with the geometry of the
        cells and faces it shares with this grid copied from here (the same bits as computing it: a regrid's
        reuse). A results file's states follow one another by a regrid each, so :func:`spherepde.io.load`
        building each from the one before does a regrid's work per state, not a whole grid's."""
        return self._with(np.asarray(state["uniq"], np.int64), balanced=False) if "uniq" in state else self

    def refined_where(self, indicator, max_passes: int | None = None) -> "AdaptiveHealpixGrid":
        """Refine repeatedly where ``indicator(grid) -> bool (n_cells,)`` holds, until it holds nowhere
        below ``nside_max`` (or ``max_passes`` passes): e.g. a patch, or where an initial density varies."""
        grid = self
        passes = self.order_max - self.order_min if max_passes is None else int(max_passes)
        for _ in range(passes):
            flag = np.asarray(indicator(grid), bool) & (grid.order < grid.order_max)
            if flag.shape != (grid.n_cells,):
                raise ValueError(f"indicator must return a boolean array of shape ({grid.n_cells},), got {flag.shape}")
            if not flag.any():
                break
            grid = grid.adapt(refine=flag)
        return grid

    # ------------------------------------------------------------ quadrature and sampling
    def _sub_roots(self):
        desc = np.stack([self._face, self._x0, self._y0, self._h], axis=1)
        return desc.astype(float), np.arange(self.n_cells)

    _sub_rule = HealpixGrid._sub_rule
    _sub_children = staticmethod(HealpixGrid._sub_children)
    _sub_ball = staticmethod(HealpixGrid._sub_ball)

    def _cell_quadrature(self, order: int, cells=None):
        """Quadrature points and weights of the listed cells (the HealpixGrid rule on each cell's square)."""
        cells = np.arange(self.n_cells) if cells is None else cells
        return _square_rule(order, self._face[cells], self._x0[cells], self._y0[cells], self._h[cells])

    cell_average = HealpixGrid.cell_average

    def sample_in_cells(self, cells, rng=None) -> np.ndarray:
        """One uniform point in each listed cell (exact: the face map is equal-area); shape (n, 3)."""
        rng = np.random.default_rng(rng)
        cells = np.asarray(cells, dtype=np.int64)
        if cells.size and (cells.min() < 0 or cells.max() >= self.n_cells):
            raise ValueError(f"cells must be in [0, {self.n_cells}), got range [{cells.min()}, {cells.max()}]")
        x = self._x0[cells] + rng.random(cells.size) * self._h[cells]
        y = self._y0[cells] + rng.random(cells.size) * self._h[cells]
        return face_map(self._face[cells], x, y)

    def cell_of(self, points) -> np.ndarray:
        """Index of the cell containing each point (n, 3)."""
        p = np.asarray(points, float)
        fine = hp.vec2pix(self.nside_max, p[:, 0], p[:, 1], p[:, 2], nest=True)
        return self._leaves.containing(np.full(fine.shape, self.order_max), fine, up=self.order_max - self.order_min)

    def to_healpix(self, f, nside: int) -> np.ndarray:
        """Resample cell averages ``f`` conservatively onto a uniform RING map at ``nside`` (a power of 2):
        a map pixel inside a cell gets the cell's average, a map pixel holding several cells their
        area-weighted mean. The map's mass sum f |C| equals the grid's to round-off."""
        k = _order_of(nside, "nside")
        f = np.asarray(f, float)
        if f.shape != (self.n_cells,):
            raise ValueError(f"f must have shape ({self.n_cells},), got {f.shape}")
        npix = 12 << (2 * k)
        out = np.zeros(npix)
        coarse = self.order <= k  # each covers 4^(k - order) map pixels
        o = self.order[coarse]
        span = np.int64(1) << (2 * (k - o))
        first = self.ipix[coarse] << (2 * (k - o))
        rep = np.repeat(np.arange(len(o)), span)
        pix = np.repeat(first, span) + (np.arange(rep.size) - np.repeat(np.cumsum(span) - span, span))
        out[pix] = f[coarse][rep]
        fine = ~coarse  # several per map pixel: area-weighted mean
        if fine.any():
            pix = self.ipix[fine] >> (2 * (self.order[fine] - k))
            num = np.bincount(pix, f[fine] * self.areas[fine], minlength=npix)
            out += num / (4 * np.pi / npix)
        return out[hp.ring2nest(nside, np.arange(npix))]


def _check_tiling(uniq):
    """ValueError unless the NUNIQ cells tile the sphere exactly once (no gaps, no overlaps)."""
    order, ipix = uniq_to_nest(np.asarray(uniq, np.int64))
    kmax = int(order.max())
    shift = 2 * (kmax - order)
    start = ipix << shift
    stop = (ipix + 1) << shift
    srt = np.argsort(start, kind="stable")
    start, stop = start[srt], stop[srt]
    total = 12 << (2 * kmax)
    if start[0] != 0 or stop[-1] != total or np.any(start[1:] != stop[:-1]):
        raise ValueError("uniq must tile the sphere: every point in exactly one cell (a gap or an overlap "
                         "was found)")


def _mask(sel, n: int, name: str) -> np.ndarray:
    if sel is None:
        return np.zeros(n, bool)
    a = np.asarray(sel)
    if a.dtype == bool:
        if a.shape != (n,):
            raise ValueError(f"{name} must be a boolean array of shape ({n},) or cell indices, got shape {a.shape}")
        return a.copy()
    a = a.astype(np.int64).ravel()
    if a.size and (a.min() < 0 or a.max() >= n):
        raise ValueError(f"{name} cell indices must be in [0, {n}), got range [{a.min()}, {a.max()}]")
    out = np.zeros(n, bool)
    out[a] = True
    return out


def transfer(f, source: AdaptiveHealpixGrid, target: AdaptiveHealpixGrid, quadratic: bool = False) -> np.ndarray:
    """Cell averages ``f`` on ``source`` moved onto ``target`` (two tilings of the same forest), conserving mass.

    A target cell that is a source cell keeps its value. Target cells inside a source cell (refinement,
    any number of orders) get the source cell's linear reconstruction f_c + theta g_c . (xbar_t - xbar_c')
    averaged over them, with g_c the least-squares gradient of ``source`` and theta in [0, 1] the largest
    factor keeping every such child >= 0 (and within [min, max] of the source cell's stencil), and xbar_c'
    the area-weighted mean of the children's xbar (so the children's mass is the parent's to round-off).
    A target cell holding several source cells (coarsening) gets their area-weighted mean.
    ``f`` of shape (N, k) moves k columns at once (each as above; the cell matching is done once).

    ``quadratic``: refined cells take the source cell's quadratic reconstruction instead
    (:func:`spherepde.grids.base.quadratic_stencil`, the scheme="quadratic" one), averaged exactly over each
    target cell from its mean position and central second moments: f_c + theta (g . u_t + h . (q_t - q')),
    u_t = B_c (xbar_t - xbar_c'), q_t the target cell's means of the monomials u_s u_r and q' their
    area-weighted mean over the children (mass to round-off), theta limited as above. Third order for
    smooth f (the linear one is second order).
    """
    f = np.asarray(f, float)
    if f.shape[:1] != (source.n_cells,) or f.ndim > 2:
        raise ValueError(f"f must have shape ({source.n_cells},) or ({source.n_cells}, k), got {f.shape}")
    cols = f.reshape(source.n_cells, -1)
    kref = max(source.order_max, target.order_max)
    def ranges(g):
        sh = 2 * (kref - g.order)
        return g.ipix << sh, (g.ipix + 1) << sh
    s0, s1 = ranges(source)
    t0, t1 = ranges(target)
    # the source cell containing each target cell's first fine pixel, and vice versa
    ss = np.argsort(s0)
    st = np.argsort(t0)
    # (any two tilings of the forest are comparable through their NESTED ranges at the finer maximum order)
    src_of_t = ss[np.searchsorted(s0[ss], t0, side="right") - 1]  # source cell with s0 <= t0
    out = np.empty((target.n_cells, cols.shape[1]))
    inside = t1 <= s1[src_of_t]  # target cell within (or equal to) a source cell
    # coarsening: target cells holding several source cells
    tgt_of_s = st[np.searchsorted(t0[st], s0, side="right") - 1]
    holds = ~inside
    if holds.any():
        contained = holds[tgt_of_s]  # the source cells inside a coarser target cell
        for j in range(cols.shape[1]):
            num = np.bincount(tgt_of_s[contained], cols[contained, j] * source.areas[contained],
                              minlength=target.n_cells)
            out[holds, j] = num[holds] / target.areas[holds]
    if inside.any():
        parent = src_of_t[inside]
        kids = np.nonzero(inside)[0]
        same = source.uniq[parent] == target.uniq[kids]
        out[kids[same]] = cols[parent[same]]
        kids, parent = kids[~same], parent[~same]
        if kids.size:
            # the gradient (and the stencil bounds below) of the refined source cells only: Grid.stencil_coef's
            # rows (ambient_coef), without building it for the whole source grid at every regrid
            up = _unique(parent)
            a = target.areas[kids]
            xc = np.zeros((source.n_cells, 3))
            for j in range(3):
                xc[:, j] = np.bincount(parent, a * target.xbar[kids, j], minlength=source.n_cells)
            area_p = np.bincount(parent, a, minlength=source.n_cells)
            xc[area_p > 0] /= area_p[area_p > 0, None]
            off = target.xbar[kids] - xc[parent]
            if quadratic:
                qcoef = source.quadratic_coef[0]
                L, Q = quadratic_width(3)
                B = source.tangent_basis[parent]  # (n, L, 3)
                lin = np.einsum("nld,nd->nl", B, off)
                mono = np.einsum("nsa,nab,ntb->nst", B, target.cell_moments2[kids], B) \
                    + lin[:, :, None] * lin[:, None, :]
                q = np.stack([mono[:, a, b] for a, b in quadratic_pairs(3)], axis=1)  # (n, Q)
                qbar = np.zeros((source.n_cells, Q))
                for j in range(Q):
                    qbar[:, j] = np.bincount(parent, a * q[:, j], minlength=source.n_cells)
                qbar[area_p > 0] /= area_p[area_p > 0, None]
                basis_k = np.concatenate([lin, q - qbar[parent]], axis=1)  # (n, L + Q)
            else:
                coef = ambient_coef(source.stencil_coef_local[up], source.tangent_basis[up])
            for j in range(cols.shape[1]):
                c = cols[:, j]
                if quadratic:
                    r = np.zeros((source.n_cells, L + Q))
                    r[up] = np.einsum("nsr,ns->nr", qcoef[up], c[source.stencil[up]] - c[up, None])
                    dv = np.einsum("nr,nr->n", r[parent], basis_k)
                else:
                    grad = np.zeros((source.n_cells, 3))
                    grad[up] = np.einsum("nsd,ns->nd", coef, c[source.stencil[up]] - c[up, None])
                    dv = np.einsum("nd,nd->n", grad[parent], off)
                # theta: children within [lo, hi] of the parent's stencil and >= 0
                nbv = c[source.stencil[up]]
                lo = np.zeros(source.n_cells)
                hi = np.zeros(source.n_cells)
                lo[up] = np.minimum(nbv.min(axis=1), c[up])  # >= 0 where f is
                hi[up] = np.maximum(nbv.max(axis=1), c[up])
                fp = c[parent]
                with np.errstate(divide="ignore", invalid="ignore"):
                    r = np.where(dv > 0, (hi[parent] - fp) / dv, np.where(dv < 0, (lo[parent] - fp) / dv, np.inf))
                theta = np.ones(source.n_cells)
                # a relative margin, as the flux limiter's (kernels.fv.OUTFLOW_MARGIN): a child on its bound
                # stays on the right side of it after rounding
                np.minimum.at(theta, parent, np.clip(r * (1.0 - OUTFLOW_MARGIN), 0.0, 1.0))
                out[kids, j] = fp + theta[parent] * dv
    return out.reshape((target.n_cells,) + f.shape[1:])
