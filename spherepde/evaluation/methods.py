"""The evaluation methods of the attention mean, one class each, behind a registry.

Each method evaluates m at a set of targets (:class:`Targets`) for weighted sources, with a per-target
error bound: it writes the targets it can certify (``|m_hat - m| <= tol``, or rounding only for the
direct sum) into ``out`` and returns the mask of those it refuses (``None``: it took them all). Where
the refused targets go next is not a method's business: :class:`~spherepde.evaluation.AttentionEvaluator`
owns the fallback chain and the choice by cost. A method reads the model's parameters (B, beta, tol,
dim) and the evaluator's caches (``ev.cache``: memos of its inputs, never state that changes a result)
and records what it did in the :class:`~spherepde.evaluation.FieldInfo`.

Registry names: ``"direct"``, ``"pruned"``, ``"series"`` (the in-house Funk-Hecke series),
``"fast_spectral"`` (ducc0 transforms), ``"circle_fft"`` (S^1 convolutions), ``"usa_direct"`` (the
unnormalised attention). A new method is one class with :func:`register`.

The formulas and bounds of each method are in :class:`spherepde.Attention`'s docstring.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np

from ..kernels import attention as _k
from ..kernels import funk_hecke as _fh
from ..kernels import tree as _tree_kernels
from ..kernels.fastexp import EXP_FLOOR

__all__ = ["Targets", "Method", "REGISTRY", "register", "SourceBlocks", "spectral_degree", "heavy_split",
           "add_heavy"]

#: Largest degree of the in-house series (beyond it the method is not competitive).
SPECTRAL_LMAX = 160
#: "auto" uses the in-house series up to this degree (its cost grows as L^2 per point).
SPECTRAL_AUTO_LMAX = 64
#: Below this many kernel pairs (targets x sources) the fast-transform path is not worth its setup.
FAST_SPECTRAL_MIN_WORK = 4e6
#: Up to this degree the in-house series (which meets tol = 1e-12, with a ~1e3 tighter rounding model) is
#: kept even where the fast path is allowed: at nside 64, L 13..34 (beta 1..10) the fast path is only
#: 0-25% faster (0.067 vs 0.068 s, 0.100 vs 0.133 s).
SPECTRAL_INHOUSE_LMAX = 40
#: Largest degree of the fast-transform (ducc0) spectral path.
SPECTRAL_LMAX_FAST = 400
#: Sources heavier than HEAVY_RATIO x the median positive weight are summed directly in the spectral
#: paths (at most N / HEAVY_FRACTION of them).
HEAVY_RATIO = 100.0
HEAVY_FRACTION = 32
#: Sources per block and blocks per super-block of the pruned method.
BLOCK = 64
SUPER = 16
#: Measured throughput of the direct kernel (kernel evaluations per CPU second, AVX2; 0.64-0.84e9 in
#: validation/bench_attention.py since its base-2 two-stage loop), for the cost model of ``method="auto"``.
DIRECT_RATE = 0.7e9
#: Sources summed per CPU second inside the pruned method (its exact block sums), at concentration kappa
#: 100, and its fall per decade of kappa (:func:`pruned_rate`). Measured 2026-12-06 (2 threads, paper
#: matrices, whose B is orthogonal: kappa = beta; tol 1e-12; uniform tokens n = 1e5 and HEALPix nside 64 /
#: 128 densities): 8.3-8.9e8 at beta 30, 7.3-8.2e8 at 100, 5.9-7.0e8 at 300, 4.9-5.6e8 at 1000; and
#: 2026-12-08 on the paper-scale adaptive run's grid at t = 1.5 (181k cells, beta 100): 7.5-7.9e8. A flat
#: 6e8 over-estimated the pruned sums 1.5x at beta 100, where "auto" then took the dual tree for the
#: series' refused targets at 1.6x the pruned sums' time (6.7 s against 3.8 s an evaluation).
PRUNED_RATE = 7.75e8
PRUNED_RATE_PER_DECADE = 2.3e8
#: The measured range: the rate is not extrapolated beyond it.
PRUNED_RATE_RANGE = (4.9e8, 8.9e8)
#: CPU seconds per source of the pruned method's blocks (:class:`SourceBlocks`), made once per source
#: set and kept: 0.24-0.30 us a source of wall time on one thread (12k-197k HEALPix cells, measured
#: 2026-12-07 with the compiled split, :func:`median_split`; 0.84-1.27 us with the segment loop in Python
#: before), counted twice since the other core waits. It decides one-off
#: evaluations at few targets (the cells a regrid made, ``Solver._refresh_new_cells``).
PRUNED_SETUP = 0.6e-6
#: Targets at which :func:`pruned_fraction` counts the sources the pruned sums keep.
PRUNED_SAMPLES = 16
#: CPU seconds per source (or target) and squared degree of the in-house series (its coefficients; the
#: per-target sums cost ~3.7x this), measured at nside 64, L 45..81.
SERIES_COST = 4.6e-10
#: The fast-transform spectral path (ducc0) is used only where its transform-error model can meet the
#: bound: (1 + sqrt 3) NUFFT_SAFETY EPS_SHT Lebesgue (~2.5) rms/D (~3 for smooth f) <= 0.9 tol.
FAST_SPECTRAL_MIN_TOL = (1.0 + math.sqrt(3.0)) * _fh.NUFFT_SAFETY * _fh.EPS_SHT * 2.5 * 3.0 / 0.9
_EPS = np.finfo(float).eps


@functools.lru_cache(maxsize=16)
def _spectral_tables(L):
    return _k.sph_recurrence(L)


@dataclass
class Targets:
    """One evaluation problem: targets as kernel centres ``U`` (M, d) (u = B^T x / |B^T x|) and
    concentrations ``kappa`` (M,) (beta |B^T x|), raw targets ``x`` (M, d), unit sources ``y`` (N, d)
    and weights ``w`` (N,) > 0. ``circle_phi0``: targets and sources are the cells phi0 + 2 pi j / N of a
    uniform circle grid, in order (the grid's hint for :class:`CircleFFT`; None otherwise)."""

    x: np.ndarray
    U: np.ndarray
    kappa: np.ndarray
    y: np.ndarray
    w: np.ndarray
    circle_phi0: float | None = None

    @property
    def M(self) -> int:
        return self.U.shape[0]

    @property
    def N(self) -> int:
        return self.y.shape[0]

    def subset(self, mask) -> "Targets":
        """The same sources, the targets where ``mask`` holds (contiguous copies)."""
        if mask.all():
            return self
        sub = Targets(np.ascontiguousarray(self.x[mask]), np.ascontiguousarray(self.U[mask]),
                      np.ascontiguousarray(self.kappa[mask]), self.y, self.w)
        if "_keep_sources" in self.__dict__:  # (the sources' arrays of pruned_fraction)
            sub.__dict__["_keep_sources"] = self.__dict__["_keep_sources"]
        return sub


class Method:
    """Protocol of an evaluation method. ``guaranteed``: it never refuses a target; ``selectable``: it can
    be asked for by name (``Attention(..., method=name)``); a method that needs a hint from the grid or a
    normalisation of its own is chosen by the evaluator only."""

    name: str = ""
    guaranteed: bool = False
    selectable: bool = True

    @staticmethod
    def available(ev) -> str | None:
        """Why the method cannot evaluate this evaluator's model (None: it can)."""
        return None

    def cost(self, ev, p: Targets) -> float:
        """Estimated CPU seconds for these targets (``inf`` where the method cannot run)."""
        return math.inf

    def run(self, ev, p: Targets, out: np.ndarray, info) -> np.ndarray | None:
        """Write the certified targets into ``out`` (M, d); return the mask of refused ones (or None)."""
        raise NotImplementedError


#: The evaluation methods by name (see :func:`register`).
REGISTRY: dict[str, Method] = {}


def register(cls):
    """Class decorator: one instance of the method in :data:`REGISTRY` under its ``name``."""
    REGISTRY[cls.name] = cls()
    return cls


# ------------------------------------------------------------------------------------ helpers
def pruned_fraction(tol: float, p: Targets) -> float:
    """Estimated fraction of the sources the pruned method sums for the targets of ``p``: at
    PRUNED_SAMPLES targets spread through ``p``, the sources whose term log w_j + kappa <u, y_j> lies
    within log(nb / eps) + 3 of the largest (those the block bound cannot skip: the research note's
    cap, but about where the weight is), averaged; kept on ``p`` per tol. On spread-out densities on S^2
    this is the cap's share (1 - cos) / 2 of the sphere; on clustered sources it is larger (tokens in
    three clusters of kappa 300 at beta 200: 2.2x the spread-out share, where the uniform-density
    formula had the pruned sums at half their cost and "auto" took them for the dual tree, 2.3x slower).
    Measured against the sources the method summed (tol 1e-12, 2026-12-06): see PRUNED_RATE."""
    memo = p.__dict__.setdefault("_pruned_fraction", {})
    if tol in memo:
        return memo[tol]
    gap = math.log(max(p.N / BLOCK, 1.0) / tol) + 3.0
    idx = np.unique(np.linspace(0, p.M - 1, min(p.M, PRUNED_SAMPLES)).astype(np.int64))
    if p.y.shape[1] == 3:  # the kernel (7-10x the speed of the NumPy twin below at 734k sources)
        src = p.__dict__.get("_keep_sources")
        if src is None:  # the sources transposed and their log weights, shared with p's subsets
            with np.errstate(divide="ignore"):
                src = p.__dict__["_keep_sources"] = (np.ascontiguousarray(p.y.T), np.log(p.w))
        counts = np.zeros(len(idx), np.int64)
        _k.pruned_keep_counts(src[0], src[1], np.ascontiguousarray(p.U[idx]), np.ascontiguousarray(p.kappa[idx]),
                              gap, counts)
        memo[tol] = frac = int(counts.sum()) / (len(idx) * p.N)
        return frac
    with np.errstate(divide="ignore"):
        lw = np.log(p.w)
    n = 0
    step = max(1, (1 << 20) // p.N)  # samples per matrix product: at most 2^20 terms (8 MB) at once
    for j in range(0, len(idx), step):
        c = idx[j:j + step]
        s = lw[:, None] + (p.y @ p.U[c].T) * p.kappa[c]
        n += int(np.count_nonzero(s >= s.max(axis=0) - gap))
    memo[tol] = frac = n / (len(idx) * p.N)
    return frac


def pruned_rate(p: Targets) -> float:
    """Sources the pruned method sums per CPU second for the targets of ``p``: PRUNED_RATE at the targets'
    mean concentration kappa = 100, falling by PRUNED_RATE_PER_DECADE a decade of kappa (a fit of the
    measurements at kappa 30-1000 to within their spread), held within PRUNED_RATE_RANGE."""
    kappa = max(float(np.mean(p.kappa)), 1e-300)
    rate = PRUNED_RATE - PRUNED_RATE_PER_DECADE * math.log10(kappa / 100.0)
    return min(max(rate, PRUNED_RATE_RANGE[0]), PRUNED_RATE_RANGE[1])


def spectral_degree(tol: float, kappa_max: float) -> tuple[int, int]:
    """Degree L of the Funk-Hecke series for concentrations up to ``kappa_max``, and the number of extra
    backward-recurrence terms. The tail at L is <= 0.1 tol / (2.8 (2 kappa_max + 1)): for a density
    within a factor 10 of uniform the truncation alone then stays below tol."""
    if kappa_max == 0.0:
        return 0, 30
    if kappa_max > SPECTRAL_LMAX:  # the degree needed exceeds SPECTRAL_LMAX (L ~ kappa + 8 sqrt(kappa))
        return SPECTRAL_LMAX + 1, 30
    ext = max(30, int(kappa_max) + 30)
    goal = 0.1 * tol / (2.8 * (2.0 * kappa_max + 1.0))
    L = int(kappa_max) // 2
    while L <= SPECTRAL_LMAX and _k.sph_tail(kappa_max, L, ext) > goal:
        L += 1
    return L, ext


def heavy_split(w):
    """Sources summed directly (weights > HEAVY_RATIO x the median positive weight, at most
    N / HEAVY_FRACTION of them) and the light weights left to the series."""
    N = w.shape[0]
    pos = w[w > 0]
    heavy = w > HEAVY_RATIO * np.median(pos)
    if heavy.sum() > N // HEAVY_FRACTION:
        heavy = np.zeros(N, dtype=bool)
        heavy[np.argpartition(w, N - N // HEAVY_FRACTION)[N - N // HEAVY_FRACTION:]] = True
    return heavy, np.where(heavy, 0.0, w)


def median_split(points, depth: int):
    """(order, starts): ``depth`` levels of recursive median bisection of the points (n, d), each segment
    split along its coordinate of largest spread (:func:`spherepde.kernels.tree.balanced_tree`, the dual
    tree's), as the 2^depth leaves' runs of ``order`` (starts[k]:starts[k + 1]; n last). With
    n >= 2^depth every leaf holds a point: the blocks of :class:`SourceBlocks` and the groups of
    :func:`add_heavy` keep >= 32 and >= 256."""
    order, start, _ = _tree_kernels.balanced_tree(np.ascontiguousarray(points, dtype=np.float64), depth)
    first = (1 << depth) - 1
    return order, np.append(start[first:first + (1 << depth)], len(points)).astype(np.int64)


#: Most groups the heavy sources are split into (:func:`add_heavy`), each of at least HEAVY_GROUP sources.
HEAVY_GROUPS_MAX = 8
HEAVY_GROUP = 256


def add_heavy(heavy, U, kappa, y, w, F, delta):
    """Adds the direct sums of the heavy sources to F (M, 4), at the targets where they can matter;
    returns the error bound (M,) this adds to each of the four sums, given the bound ``delta`` (M,) of
    the rest.

    The heavy sources are split into G compact groups (the source blocks' median split, up to
    HEAVY_GROUPS_MAX groups of at least HEAVY_GROUP sources: two clusters at +-c, the late state of the
    attention flow, fall into different groups, where one cap around both would hold the whole sphere).
    A group lies in a cap (centre c, angular radius r); at a target whose kernel centre u is at angle theta
    from c, every term of the group is <= w_j exp(kappa (cos(max(theta - r, 0)) - 1)) (and |y| = 1 bounds
    the numerator terms alike), so its sums are <= that times its sum w_j. Where this is <= 1e-3 delta / G
    (far from that group) its sums are skipped and the bound (doubled, for the rounding of the angles) is
    added instead: the error bound grows by at most 0.1% over all groups. Elsewhere: the direct sums,
    whose exp floor adds <= 2.6e-261 sum w_j."""
    M = F.shape[0]
    if not heavy.any():
        return np.zeros(M)
    yh = np.ascontiguousarray(y[heavy])
    wh = np.ascontiguousarray(w[heavy])
    depth = max(0, min(int(math.log2(HEAVY_GROUPS_MAX)), int(math.log2(max(len(wh) / HEAVY_GROUP, 1.0)))))
    order, starts = median_split(yh, depth)
    G = len(starts) - 1
    extra = np.zeros(M)
    for g in range(G):
        idx = order[starts[g]:starts[g + 1]]
        yg, wg = yh[idx], np.ascontiguousarray(wh[idx])
        wsum = float(wg.sum())
        todo = np.ones(M, dtype=bool)
        floor = np.full(M, math.exp(EXP_FLOOR) * wsum)
        c = wg @ yg
        nc = float(np.linalg.norm(c))
        if nc > 0.0:
            c = c / nc
            r = math.acos(min(1.0, max(-1.0, float((yg @ c).min())))) + 1e-12
            theta = np.arccos(np.clip(U @ c, -1.0, 1.0))
            cap = 2.0 * wsum * np.exp(kappa * (np.cos(np.maximum(theta - r, 0.0)) - 1.0))
            skip = cap <= 1e-3 * delta / G
            floor[skip] = cap[skip]
            todo = ~skip
        extra += floor
        if todo.any():
            sel = slice(None) if todo.all() else todo  # all: no copies of U and kappa
            Uh, kh = np.ascontiguousarray(U[sel]), np.ascontiguousarray(kappa[sel])
            Fh = np.empty((kh.shape[0], 4))
            _k.direct3_sums(Uh, kh, np.ascontiguousarray(yg.T), wg, Fh)
            F[sel] += Fh
    return extra


def _accept(F, delta, tol, out, ev=None, kappa=None):
    """The four sums F (M, 4) with their bound delta (M,): m = F[1:] / F[0] where the bound
    (1 + sqrt 3) delta / D (plus 64 eps for the heavy direct sums) is <= 0.9 tol. Returns (refused mask,
    the largest bound accepted).

    The unnormalised attention (``ev.model.normalization == "usa"``, with the targets' ``kappa``): m = F[1:]
    e^{kappa - beta s_B} (the sums are of the kernel shifted by kappa; e^{kappa - beta s_B} <= 1), with the
    absolute bound sqrt(3) (delta + 64 eps |F|) e^{kappa - beta s_B} per component; no division by D, so
    targets far from the mass are not refused."""
    D = F[:, 0]
    if ev is not None and ev.model.normalization == "usa":
        scale = np.exp(kappa - ev.model.beta * ev.model.usa_shift)
        bound = math.sqrt(3.0) * (delta + 64.0 * _EPS * np.abs(F[:, 1:]).max(axis=1)) * scale
        ok = bound <= 0.9 * tol
        out[ok] = F[ok, 1:] * scale[ok, None]
        return ~ok, (float(bound[ok].max()) if ok.any() else 0.0)
    # m_hat - m = (N_hat - N) / D_hat + m (D - D_hat) / D_hat, |N_hat - N| <= sqrt(3) delta;
    # heavy part: direct sums, relative rounding ~ 1e-16 x (terms): counted as 64 eps D
    delta = delta + 64.0 * _EPS * np.abs(D)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = (1.0 + math.sqrt(3.0)) * delta / D
    ok = (D > 1e-250) & (bound <= 0.9 * tol)
    out[ok] = F[ok, 1:] / D[ok, None]
    return ~ok, (float(bound[ok].max()) if ok.any() else 0.0)


class SourceBlocks:
    """Sources sorted into compact blocks (recursive coordinate bisection), any dimension.

    Parameters
    ----------
    sources : (N, d) array
        Unit source points.
    block : int
        Leaf size bound: leaves hold ``<= block`` points (about ``block / 2`` to ``block``).
    group : int
        Leaves per super-block.

    Attributes
    ----------
    perm : (N,) int64
        Sorting permutation: block k holds ``sources[perm[bstart[k]:bstart[k+1]]]``.
    S : (d, N) float64
        Sorted, transposed sources.
    bstart, sstart : int64 arrays
        Block ranges (in sources) and super-block ranges (in blocks).
    bc, bcr, bsr, sc, scr, ssr : arrays
        Centres (d, n) and cos / sin of the angular radii of blocks and super-blocks.

    Notes
    -----
    The blocks depend only on the point set (never on a grid's numbering): each level splits every
    segment at the median of its coordinate of largest spread. Leaves of one subtree are consecutive,
    so super-blocks (``group`` consecutive leaves) are compact too.
    """

    def __init__(self, sources: np.ndarray, block: int = BLOCK, group: int = SUPER):
        N, d = sources.shape
        self.key = sources.copy()
        depth = max(0, math.ceil(math.log2(max(N / block, 1.0))))
        order, self.bstart = median_split(sources, depth)
        self.perm = order
        self.S = np.ascontiguousarray(sources[order].T)
        nbk = len(self.bstart) - 1
        self.sstart = np.append(np.arange(0, nbk, group), nbk).astype(np.int64)
        pts = sources[order]
        self.bc, self.bcr, self.bsr = self._geometry(pts, self.bstart)
        sb = self.bstart[self.sstart]
        self.sc, self.scr, self.ssr = self._geometry(pts, sb)
        self.bcT = np.ascontiguousarray(self.bc.T)
        self.scT = np.ascontiguousarray(self.sc.T)

    @staticmethod
    def _geometry(pts, starts):
        c, cr, sr = cap_geometry(pts, starts)
        return np.ascontiguousarray(c.T), cr, sr

    def log_masses(self, w_sorted: np.ndarray):
        with np.errstate(divide="ignore"):
            bm = np.log(np.add.reduceat(w_sorted, self.bstart[:-1]))
            sm = np.log(np.add.reduceat(w_sorted, self.bstart[self.sstart[:-1]]))
        return bm, sm


# ------------------------------------------------------------------------------------ the methods
def cap_geometry(pts: np.ndarray, starts: np.ndarray):
    """The caps holding runs of unit points: for the points pts[starts[i]:starts[i + 1]], the centre (their
    normalised sum; the first point where that sum nearly vanishes) as rows (n, d), and the cos and sin of
    the angular radius, widened by a rounding margin so that the cap holds every point of the run."""
    sums = np.add.reduceat(pts, starts[:-1], axis=0)
    nrm = np.linalg.norm(sums, axis=1)
    c = np.where(nrm[:, None] > 1e-8, sums / np.maximum(nrm, 1e-300)[:, None], pts[starts[:-1]])
    c /= np.linalg.norm(c, axis=1)[:, None]
    owner = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    dots = np.einsum("ij,ij->i", pts, c[owner])
    cr = np.minimum.reduceat(dots, starts[:-1])
    cr = np.clip(cr - 1e-12, -1.0, 1.0)
    sr = np.sqrt(1.0 - cr * cr)
    return c, cr, sr


@register
class Direct(Method):
    """O(N M) sums, exact to rounding (the reference); any d."""

    name = "direct"
    guaranteed = True

    def cost(self, ev, p):
        return p.N * p.M / DIRECT_RATE

    def run(self, ev, p, out, info):
        S = np.ascontiguousarray(p.y.T)
        with np.errstate(divide="ignore"):
            lw = np.log(p.w)
        if p.U.shape[1] == 3:
            _k.direct3(p.U, p.kappa, S, p.w, lw, out)
        else:
            _k.direct_nd(p.U, p.kappa, S, p.w, lw, out)
        info.note(self.name, p.M, 0.0)
        return None


@register
class Pruned(Method):
    """Blocks of sources skipped where their bound is below eps D_1 / (number of blocks): rigorous,
    |m_hat - m| <= 2 eps / (1 - eps), eps = 0.45 tol; any d."""

    name = "pruned"
    guaranteed = True

    def cost(self, ev, p):
        frac = min(1.0, 1.2 * pruned_fraction(ev.model.tol, p))
        setup = 0.0 if self._blocks(ev, p) is not None else PRUNED_SETUP * p.N
        return p.N * p.M * frac / pruned_rate(p) + p.M * (p.N / (BLOCK * SUPER)) * 2e-9 + setup

    @staticmethod
    def _blocks(ev, p):
        """The evaluator's blocks of these sources, None where it has none made for them."""
        sb = ev.cache.get("blocks")
        if sb is None or sb.key.shape != p.y.shape or not np.array_equal(sb.key, p.y):
            return None
        return sb

    def run(self, ev, p, out, info):
        sb = self._blocks(ev, p)
        if sb is None:
            sb = ev.cache["blocks"] = SourceBlocks(p.y)
        ws = p.w[sb.perm]
        with np.errstate(divide="ignore"):
            lw = np.log(ws)
        blogm, slogm = sb.log_masses(ws)
        nsum = np.empty(p.M, dtype=np.int64)
        # |m_hat - m| <= 2 eps / (1 - eps); the factor 0.45 leaves room for rounding
        eps = 0.45 * ev.model.tol
        kern = _k.pruned3 if p.U.shape[1] == 3 else _k.pruned
        kern(p.U, p.kappa, sb.S, ws, lw, sb.bstart, sb.bc, sb.bcr, sb.bsr, blogm, sb.sstart, sb.sc, sb.scr,
             sb.ssr, slogm, eps, out, nsum)
        info.nsum = nsum
        info.note(self.name, p.M, 2.0 * eps / (1.0 - eps))
        return None


@register
class Series(Method):
    """The in-house Funk-Hecke series (d = 3) with its per-target bound; refuses targets whose bound
    exceeds 0.9 tol (far from the mass of a concentrated density)."""

    name = "series"

    @staticmethod
    def available(ev) -> str | None:
        return None if ev.model.dim == 3 else "the Funk-Hecke series is implemented for d = 3 only"

    def degree(self, ev, p) -> int:
        return spectral_degree(ev.model.tol, float(p.kappa.max()))[0]

    def cost(self, ev, p):
        """CPU seconds (measured on the 2-core machine at nside 64, L 45..81): the source coefficients
        N L^2 and the per-target sums M L^2 (~3.7x the cost per point); inf beyond SPECTRAL_LMAX or d != 3."""
        if p.U.shape[1] != 3:
            return math.inf
        L = self.degree(ev, p)
        return math.inf if L > SPECTRAL_LMAX else (p.N + 3.7 * p.M) * (L + 1) ** 2 * SERIES_COST

    def run(self, ev, p, out, info):
        tol = ev.model.tol
        U, kappa, y, w = p.U, p.kappa, p.y, p.w
        kmax = float(kappa.max())
        L, ext = spectral_degree(tol, kmax)
        M = p.M
        if L > SPECTRAL_LMAX:  # kappa too large for the series: everything is refused
            info.note(self.name, M, 0.0, refused=M)
            return np.ones(M, dtype=bool)
        off, ra, rb, pmm = _spectral_tables(L)
        # the few heaviest sources are summed directly; the series carries only the light rest, whose error
        # scales with its own (small) mass: this keeps concentrated densities on the fast path
        heavy, wl = heavy_split(w)
        C = _k.sph_coeffs(np.ascontiguousarray(y.T), wl, L, off, ra, rb, pmm)
        R = np.sqrt(C[0::2] ** 2 + C[1::2] ** 2).max(axis=0)
        # targets sorted by kappa, each chunk of 128 summed to the degree its largest kappa needs
        order = np.argsort(kappa, kind="stable")
        Us, ks = np.ascontiguousarray(U[order]), np.ascontiguousarray(kappa[order])
        ch = _k._CH
        kc = ks[np.minimum(np.arange(ch - 1, M + ch - 1, ch), M - 1)]
        lo = max(float(kc.min()), 1e-3)
        grid = np.unique(np.concatenate([np.geomspace(lo, kmax, 24), [kmax]])) if kmax > lo else np.array([kmax])
        degs = np.array([spectral_degree(tol, float(g))[0] for g in grid])
        Lc = np.minimum(degs[np.minimum(np.searchsorted(grid, kc), len(grid) - 1)], L).astype(np.int64)
        Lc[kc == 0.0] = 0
        Fs = np.empty((M, 4))
        abs_s = np.empty(M)
        tail_s = np.empty(M)
        _k.sph_eval(Us, ks, C, R, Lc, off, ra, rb, pmm, Fs, abs_s, tail_s)
        F = np.empty((M, 4))
        absum = np.empty(M)
        tail = np.empty(M)
        F[order] = Fs
        absum[order] = abs_s
        tail[order] = tail_s
        w1 = float(wl.sum())
        w2 = float(np.sqrt(np.dot(wl, wl)))
        # truncation: rigorous (|P_l| <= 1, |y| = 1, so each of the four maps is off by <= ||w||_1 tail).
        # rounding: a model, not a proof: 8 eps sqrt(L + 1) times the a-posteriori absolute sum of the
        # target series plus the propagated source-moment noise ||w||_2 sqrt(2L + 1) (random-walk
        # accumulation over the L + 1 degrees; it over-estimates the measured errors 20-70 times).
        delta = w1 * tail + 8.0 * _EPS * math.sqrt(L + 1) * (absum + w2 * math.sqrt(2 * L + 1))
        delta = delta + add_heavy(heavy, U, kappa, y, w, F, delta)
        bad, bound = _accept(F, delta, tol, out, ev, kappa)
        info.degree = max(info.degree or 0, L)
        info.heavy = int(heavy.sum())
        info.note(self.name, M, bound, refused=int(bad.sum()))
        return bad


@register
class FastSpectral(Method):
    """The Funk-Hecke series by fast transforms (ducc0, d = 3): targets binned by kappa, Chebyshev
    interpolation in kappa with a rigorous interpolation and truncation bound plus a transform-error
    model; refuses targets of low D (far from the bulk of the mass)."""

    name = "fast_spectral"

    @classmethod
    def allowed(cls, ev) -> bool:
        return cls.available(ev) is None

    @staticmethod
    def available(ev) -> str | None:
        if ev.model.dim != 3:
            return "the fast transforms are implemented for d = 3 only"
        if not _fh.available():
            return "it needs the ducc0 package (pip install ducc0)"
        if ev.model.tol < FAST_SPECTRAL_MIN_TOL:
            return (f"its transform-error model cannot meet tol = {ev.model.tol:g} (it needs tol >= "
                    f"{FAST_SPECTRAL_MIN_TOL:.2g})")
        return None

    def plan(self, ev, kappa, cost_cap=math.inf):
        """(estimated CPU seconds, plan, sorting order); with a ``cost_cap`` (the cost of another
        method), (inf, None, order) if it cannot be cheaper (the plan is then not kept)."""
        key = ("fast_plan", kappa.shape[0], float(kappa.min()), float(kappa.max()), float(kappa.sum()))
        hit = ev.cache.get("fast_plan")
        if hit is not None and hit[0] == key:
            return hit[1]
        hit = ev.cache.get("fast_plan_capped")
        if hit is not None and hit[0][0] == key:
            if cost_cap <= hit[0][1]:  # dearer than a larger cap: dearer than this one
                return hit[1]
            # The same targets (a grid's cells) under a larger cap: the caps follow the other methods'
            # models, which move with the density, and a plan made anew for each (~10 ms at nside 16, more
            # than the pruned sums there) cost the default experiment 4x its field time. The whole plan,
            # once, kept under "fast_plan".
            cost_cap = math.inf
        order = np.argsort(kappa, kind="stable")
        ks = kappa[order]
        goal = 0.1 * ev.model.tol / (2.8 * (2.0 * float(ks[-1]) + 1.0))
        cost, bins = _fh.plan(ks, goal, SPECTRAL_LMAX_FAST, cost_cap)
        res = (cost, bins, order)
        if bins is not None or not math.isfinite(cost_cap):
            ev.cache["fast_plan"] = (key, res)
        else:  # not built because another method is cheaper: a plan asked for without a cap is made anew
            ev.cache["fast_plan_capped"] = ((key, cost_cap), res)
        return res

    def cost(self, ev, p, cap=math.inf):
        if not self.allowed(ev):
            return math.inf
        return self.plan(ev, p.kappa, cap)[0]

    def run(self, ev, p, out, info):
        M = p.M
        cost, bins, order = self.plan(ev, p.kappa)
        if bins is None:
            info.note(self.name, M, 0.0, refused=M)
            return np.ones(M, dtype=bool)
        heavy, wl = heavy_split(p.w)
        F, delta = _fh.spectral_sums(p.U, p.kappa, p.y, wl, bins, order, numba.get_num_threads(), cache=ev.cache)
        delta = delta + add_heavy(heavy, p.U, p.kappa, p.y, p.w, F, delta)
        bad, bound = _accept(F, delta, ev.model.tol, out, ev, p.kappa)
        info.degree = max(b[4] for b in bins)
        info.plan = [(b[2], b[3], b[4], b[5], b[1] - b[0]) for b in bins]
        info.heavy = int(heavy.sum())
        info.note(self.name, M, bound, refused=int(bad.sum()))
        return bad


@register
class CircleFFT(Method):
    """On a uniform ordered circle grid (d = 2, targets = sources = the cells) with B a rotation times a
    scale, the sums are circular convolutions (:mod:`spherepde.kernels.circle`), O(N log N), with a
    run-time bound; all targets are refused where the bound exceeds tol."""

    name = "circle_fft"
    selectable = False

    def cost(self, ev, p):
        return 0.0 if self.applies(ev, p) else math.inf

    @staticmethod
    def applies(ev, p) -> bool:
        from ..kernels.circle import rotation_scale

        return (p.circle_phi0 is not None and p.M == p.N and ev.model.dim == 2
                and rotation_scale(ev.model.B) is not None)

    def run(self, ev, p, out, info):
        from ..kernels.circle import circle_fft

        m, bound = circle_fft(ev.model.B, ev.model.beta, p.circle_phi0, p.w, ev.model.tol,
                              normalised=ev.model.normalization == "softmax")
        if m is None:
            info.note(self.name, p.M, 0.0, refused=p.M)
            return np.ones(p.M, dtype=bool)
        out[:] = m
        info.note(self.name, p.M, bound)
        return None


@register
class UsaDirect(Method):
    """The unnormalised attention (USA): m(x_i) = sum_j w_j y_j exp(beta (<x_i, B y_j> - s_B)), the
    softmax mean times its normaliser exp(lse_i - beta s_B) <= sum_j w_j (the kernel of the particle
    code: one pass, no overflow); exact to rounding, O(N M). (The series, the fast transforms and the
    circle FFT evaluate the USA too, with an absolute bound; pruning does not: its bound is relative.)"""

    name = "usa_direct"
    guaranteed = True
    selectable = False

    def cost(self, ev, p):
        return p.N * p.M / DIRECT_RATE

    def run(self, ev, p, out, info):
        from ..kernels.particles import launch, softmax_mean

        model = ev.model
        x = np.ascontiguousarray(p.x)
        lse = np.empty(x.shape[0])
        with np.errstate(divide="ignore"):
            lw = np.log(p.w)
        launch(softmax_mean, x.shape[0] * p.N, x, np.ascontiguousarray(p.y.T), lw, np.ascontiguousarray(model.B),
               model.beta, out, lse)
        out *= np.exp(lse - model.beta * model.usa_shift)[:, None]
        info.note(self.name, p.M, 0.0)
        return None


# ------------------------------------------------------------------------------------ the dual tree
#: Points per leaf of the dual tree's target and source trees (the kernels' block size, which bounds a
#: leaf: 128 measured 10-20 % faster than 64 at n = 1e5).
TREE_LEAF = _tree_kernels._CH
#: Largest expansion degree of the dual tree, by dimension (monomials: 969 for d = 3, 325 for d = 2).
TREE_PMAX = {2: 24, 3: 16}
#: Measured rates of the dual tree's work (2 threads, validation/bench_particles.py at n = 1e5): leaf
#: pairs summed directly (target-source products per second: 5.4e8 measured on clustered points, 3.7e8 on
#: uniform ones) and expansion terms
#: (sources + targets times monomials, ~2e9 measured), and its set-up (both trees and the leaves' bounds)
#: per point.
TREE_DIRECT_RATE = 3.5e8
TREE_TERM_RATE = 2e9
TREE_SETUP = 1.5e-6
#: The degree tables by slack (kernels.tree.traverse): rows a factor e^TREE_SLACK_STEP = 100 apart in the
#: pair's allowed relative error, up to TREE_PAIR_EPS_MAX (a pair 1e12 below its share of the sums).
TREE_SLACK_STEP = math.log(100.0)
TREE_SLACK_ROWS = 8
TREE_PAIR_EPS_MAX = 1e-2
#: The guaranteed method's cost below which "auto" does not plan the tree (seconds), and the problem size
#: (kernel pairs) below which it never does.
TREE_MIN_SECONDS = 0.05
#: The dual tree's memory budget for the expansions' moments (bytes; 32 a moment row): beyond it they are
#: formed and evaluated in batches of target leaves (:func:`_moment_batches`). Unbounded, they took ~1 GB
#: at ~130000 cells of the paper-scale adaptive run (validation/bench_adaptive.py --paper). On that run's
#: first tree problem (131532 cells, quiet, alternated): sums 5.0-5.5 s at 128 MiB, 5.2-5.9 s at 256 MiB,
#: 5.1-5.7 s at 32-64 MiB, 7.1 s unbounded (page faults); the process's peak 487 MiB at 128, 613 at 256.
TREE_MOMENT_BYTES = 128 * 2**20
TREE_MIN_WORK = 2e8


def _balanced_tree(P: np.ndarray, leaf: int):
    """Complete binary tree of recursive median bisection (along the coordinate of largest spread), leaves
    of <= ``leaf`` points: (order, depth, start, end), nodes in heap order (children 2k + 1, 2k + 2)."""
    depth = max(0, math.ceil(math.log2(max(P.shape[0] / leaf, 1.0))))
    order, start, end = _tree_kernels.balanced_tree(np.ascontiguousarray(P), depth)
    return order, depth, start, end


@functools.lru_cache(maxsize=8)
def _tree_tables(d: int, pmax: int):
    return _tree_kernels.monomial_tables(d, pmax)


@functools.lru_cache(maxsize=8)
def _tree_chebyshev(pmax: int) -> np.ndarray:
    return _tree_kernels.chebyshev_table(pmax)


def _tree_rho_max(eta: float, d: int, pmax: int) -> np.ndarray:
    """For each degree p, the largest rho = r_T r_S at which a pair expanded at degree p (the truncated
    Chebyshev series of e^t on [-rho, rho]) has the relative error bound
    :func:`spherepde.kernels.tree.expansion_error` <= eta (its tail plus rounding); -1 where no rho > 0
    meets it."""
    return _tree_kernels.rho_max_table(float(eta), int(pmax), _tree_chebyshev(pmax), _tree_tables(d, pmax)[3])


class _TreeSetup:
    """The dual tree of one problem: both trees, the leaves' lower bounds and the error budget."""

    def __init__(self, ev, p: Targets):
        _t = _tree_kernels
        d = p.U.shape[1]
        tol = ev.model.tol
        u = p.U * p.kappa[:, None]
        self.torder, self.tdepth, self.tstart, self.tend = _balanced_tree(u, TREE_LEAF)
        self.sorder, self.sdepth, self.sstart, self.send = _balanced_tree(p.y, TREE_LEAF)
        self.Ut = np.ascontiguousarray(u[self.torder])
        self.Ys = np.ascontiguousarray(p.y[self.sorder])
        self.ws = np.ascontiguousarray(p.w[self.sorder])
        self.tc, self.tr = _t.node_balls(self.Ut, self.tstart, self.tend)
        self.sc, self.sr = _t.node_balls(self.Ys, self.sstart, self.send)
        tl0, sl0 = 2 ** self.tdepth - 1, 2 ** self.sdepth - 1  # the first leaves
        # node masses summed exactly from the leaves up (no differences of a cumulative sum: a light node
        # beside heavy ones keeps its mass)
        wnode = np.zeros(self.sstart.shape[0])
        wnode[sl0:] = [self.ws[a:b].sum() for a, b in zip(self.sstart[sl0:], self.send[sl0:])]
        for k in range(sl0 - 1, -1, -1):
            wnode[k] = wnode[2 * k + 1] + wnode[2 * k + 2]
        with np.errstate(divide="ignore"):
            self.slogw = np.log(wnode)
        lb = np.empty(2 ** self.tdepth)
        gap = np.empty(2 ** self.tdepth)
        _t.leaf_lower_bounds(self.tc, self.tr, tl0, lb.shape[0], self.sc, self.sr, self.slogw, sl0,
                             2 ** self.sdepth, lb, gap)
        lbmin = np.empty(self.tstart.shape[0])
        lbmin[tl0:] = lb
        for k in range(tl0 - 1, -1, -1):
            lbmin[k] = min(lbmin[2 * k + 1], lbmin[2 * k + 2])
        self.lbmin = lbmin
        # each target's exponent shift: its leaf's lower bound of log D_i
        self.shift = np.repeat(lb, self.tend[tl0:] - self.tstart[tl0:])
        # the error budget: (1 + sqrt 3) (eta + 64 eps) <= 0.9 tol in _accept, eta the relative error of the
        # sums: expansions (eta_e: eta_e / 2 of each pair's sums, or of its share of D_i where it is light, see
        # kernels.tree.traverse), pruning (eta_p), and rounding: an
        # exponent <u, y> - shift (a d-term dot product of size <= kappa, then a difference) is off by
        # <= (3 kappa + |<u, y> - shift|) eps; the terms that count have <u, y> - shift between -64 (below,
        # e^-64 of D) and the leaves' gap (the largest exponent bound above the shift); fexp_ftz adds
        # <= 3.3e-14 (fastexp's worst case)
        kmax = float(p.kappa.max())
        self.eta_round = (3.0 * kmax + max(64.0, float(gap.max()))) * _EPS + 3.3e-14
        budget = 0.9 * tol / (1.0 + math.sqrt(3.0)) - 64.0 * _EPS - self.eta_round
        # a term may lie up to the gap above the shift: beyond ~600 its exp would overflow (beta in the
        # thousands with wide leaves); the tree then refuses, and the pruned sums (log domain) take over
        self.ok = budget > 0.0 and float(gap.max()) < 600.0
        # the pruning threshold enters through its log only: a tenth of the budget costs it little
        self.eta_e, self.eta_p = 0.8 * max(budget, 0.0), 0.1 * max(budget, 0.0)
        self.pmax = TREE_PMAX[d]
        par, ax, inv, nmono = _tree_tables(d, self.pmax)
        self.par, self.ax, self.inv, self.nmono = par, ax, inv, nmono
        # degree tables by slack (kernels.tree.traverse): row j serves pairs whose mass bound lies exp(j
        # TREE_SLACK_STEP) below their share of the targets' sums, at the pair error eta_e / 2 exp(j step);
        # the pairs of row 0 and the others take eta_e / 2 each
        row_eps = [min(0.5 * self.eta_e * math.exp(j * TREE_SLACK_STEP), TREE_PAIR_EPS_MAX)
                   for j in range(TREE_SLACK_ROWS)]
        self.rho_max = (np.array([_tree_rho_max(e, d, self.pmax) for e in row_eps])
                        if self.ok else np.full((1, self.pmax + 1), -1.0))
        self.log_w = float(np.log(self.ws.sum()))
        self.log_prune = (math.log(self.eta_p) if self.ok else -math.inf) - self.log_w
        self.plan = None

    def _plan(self):
        if self.plan is None:
            self.plan = _tree_kernels.traverse(self.tdepth, self.tstart, self.tend, self.tc, self.tr, self.lbmin, self.sdepth,
                                    self.sstart, self.send, self.sc, self.sr, self.slogw, self.log_prune,
                                    self.log_w, self.rho_max, TREE_SLACK_STEP, self.nmono)
        return self.plan

    @property
    def stats(self) -> np.ndarray:
        """(products summed directly, expansion terms, pairs pruned, pairs expanded)."""
        return self._plan()[5]

    def sums(self) -> np.ndarray:
        """The four shifted sums (M, 4) at the sorted targets. The expansions' moments are formed and evaluated
        in batches of target leaves (:func:`_moment_batches`), so that they take at most about
        TREE_MOMENT_BYTES at once; each moment and each target's sums are the same operations in the same
        order whatever the batches (the same bits)."""
        _t = _tree_kernels
        eT, eS, eP, dT, dS, _ = self._plan()
        nnodes = self.tstart.shape[0]
        order = np.argsort(eT, kind="stable")
        eT, eS, eP = eT[order], eS[order], eP[order]
        eptr = np.searchsorted(eT, np.arange(nnodes + 1)).astype(np.int64)
        rows, off, batches = _moment_batches(eT, self.nmono[eP], self.tdepth, TREE_MOMENT_BYTES // 32)
        A = np.empty((rows, 4))
        self.moment_rows = rows  # the moments' working set (rows of 4 doubles), for the memory tests
        # the sources and targets transposed and padded to 3 rows (d = 2: a zero row), for unit-stride loops
        YsT = np.zeros((3, self.Ys.shape[0]))
        YsT[:self.Ys.shape[1]] = self.Ys.T
        UtT = np.zeros((3, self.Ut.shape[0]))
        UtT[:self.Ut.shape[1]] = self.Ut.T
        first = 2 ** self.tdepth - 1
        dorder = np.argsort(dT, kind="stable")
        dT, dS = dT[dorder] - first, dS[dorder]
        dptr = np.searchsorted(dT, np.arange(2 ** self.tdepth + 1)).astype(np.int64)
        F = np.empty((self.Ut.shape[0], 4))
        Tm = _tree_chebyshev(self.pmax)
        for sel, l0, l1 in batches:
            if sel.shape[0]:
                _t.moments(eT[sel], eS[sel], eP[sel], off[sel], self.tc, self.tr, YsT, self.ws, self.sstart,
                           self.send, self.sc, self.sr, self.nmono, self.par, self.ax, self.inv, Tm, A)
            if l1 > l0:
                _t.evaluate(self.tdepth, self.tstart, self.tend, UtT, self.shift, self.tc, self.sr,
                            self.sc, eptr, eS, eP, off, A, dptr, dS, self.sstart, self.send, YsT, self.ws,
                            self.nmono, self.par, self.ax, F, l0, l1)
        return F

    def seconds(self) -> float:
        st = self.stats
        return float(st[0] / TREE_DIRECT_RATE + st[1] / TREE_TERM_RATE) + TREE_SETUP * (self.Ut.shape[0] + self.Ys.shape[0])


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Where consecutive blocks of ``sizes`` rows start (the exclusive prefix sums; empty for none)."""
    sizes = np.asarray(sizes, np.int64)
    return np.cumsum(sizes) - sizes


def _moment_batches(eT: np.ndarray, sizes: np.ndarray, tdepth: int, budget: int):
    """Batches of the dual tree's expansions under a memory budget. ``eT``: the expansions' target nodes
    (heap order, sorted), ``sizes``: their moment rows, ``budget``: rows. Returns (rows of A, each
    expansion's offset in A, [(expansions to form, first leaf, end leaf)]): evaluating the leaves l0 <= l <
    l1 of a batch reads the moments of their own nodes and of their ancestors. Within the budget: one batch.
    Otherwise the expansions above a depth k stay resident (formed once, first) and those of each subtree
    at depth k are formed with their subtree's leaves, consecutive subtrees merged up to the budget, into
    one region of A that each batch overwrites; k minimises the peak (resident plus the largest subtree)."""
    ne = eT.shape[0]
    total = int(sizes.sum())
    nleaf = 1 << tdepth
    everything = np.arange(ne)
    if total <= budget or tdepth == 0:
        return total, _starts(sizes), [(everything, 0, nleaf)]
    depth = np.floor(np.log2(eT + 1.0)).astype(np.int64)
    best = None
    for k in range(1, tdepth + 1):
        deep = depth >= k
        resident = int(sizes[~deep].sum())
        sub = ((eT[deep] + 1) >> (depth[deep] - k)) - (1 << k)  # the depth-k ancestor, numbered within depth k
        per = np.bincount(sub, weights=sizes[deep], minlength=1 << k)
        peak = resident + int(per.max())
        if best is None or peak < best[0]:
            best = (peak, k, resident, per, sub, deep)
    _, k, resident, per, sub, deep = best
    cap = max(int(per.max()), budget - resident)
    # consecutive subtrees merged while their moments fit in the cap
    group = np.empty(1 << k, dtype=np.int64)
    g, used = 0, 0
    for j in range(1 << k):
        if used + per[j] > cap and used > 0:
            g, used = g + 1, 0
        group[j] = g
        used += int(per[j])
    off = np.empty(ne, dtype=np.int64)
    res_idx = everything[~deep]
    off[res_idx] = _starts(sizes[res_idx])
    deep_idx = everything[deep]
    bg = group[sub]
    batches = [(res_idx, 0, 0)]
    span = nleaf >> k  # leaves per depth-k subtree
    for b in range(g + 1):
        idx = deep_idx[bg == b]  # in eT order: the batch's offsets follow one another
        off[idx] = resident + _starts(sizes[idx])
        js = np.flatnonzero(group == b)
        batches.append((idx, int(js[0]) * span, (int(js[-1]) + 1) * span))
    return resident + cap, off, batches


def _tree_setup(ev, p: Targets) -> _TreeSetup:
    got = ev.cache.get("tree")
    if got is not None and got[0] is p:
        return got[1]
    setup = _TreeSetup(ev, p)
    ev.cache["tree"] = (p, setup)
    return setup


@register
class Tree(Method):
    """The dual tree (:mod:`spherepde.kernels.tree`): target and source trees of balls, pairs of nodes
    pruned, expanded (the coupling exp(<du, delta>) by its truncated Chebyshev series on [-rho, rho], with
    the series' tail as the bound) or summed directly at the leaves. For concentrated point sets (tokens in
    clusters) whole clusters interact through one expansion, O((N + M) P) instead of O(N M). d = 2 or 3, softmax
    normalisation. |m_hat - m| <= (1 + sqrt 3) (eta + 64 eps) with eta = eta_e + eta_p + eta_round the
    relative error of the sums; refuses every target where tol leaves no budget (the exponents' rounding
    alone, ~3 eps kappa, exceeds it) or a term could overflow."""

    name = "tree"

    @staticmethod
    def available(ev) -> str | None:
        if ev.model.dim not in TREE_PMAX:
            return f"the dual tree is implemented for d = 2 and 3, not d = {ev.model.dim}"
        if ev.model.normalization == "usa":
            return "the dual tree's bound is relative to the softmax normaliser"
        return None

    def cost(self, ev, p):
        if self.available(ev) is not None:
            return math.inf
        s = _tree_setup(ev, p)
        return s.seconds() if s.ok else math.inf

    def run(self, ev, p, out, info):
        s = _tree_setup(ev, p)
        if not s.ok:
            info.note(self.name, p.M, 0.0, refused=p.M)
            return np.ones(p.M, dtype=bool)
        Fs = s.sums()
        d = p.U.shape[1]
        F = np.empty_like(Fs)
        F[s.torder] = Fs
        eta = s.eta_e + s.eta_p + s.eta_round
        delta = eta / (1.0 - eta) * F[:, 0]
        res = np.empty((p.M, d))
        bad, bound = _accept(np.ascontiguousarray(F[:, :d + 1]), delta, ev.model.tol, res)
        out[~bad] = res[~bad]
        info.note(self.name, p.M, bound, refused=int(bad.sum()))
        ev.cache.pop("tree", None)
        return bad if bad.any() else None
