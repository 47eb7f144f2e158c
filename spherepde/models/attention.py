"""Finite-temperature model: the softmax-attention mean field m_beta and v = P_x(V m_beta).

Conventions (MODEL.md): score <x, B y> with B = Q^T K, value map y -> V y, so

    m_beta(x) = sum_j y_j exp(beta <x, B y_j>) w_j / sum_j exp(beta <x, B y_j>) w_j,
    v(x) = P_x(V m_beta(x)),   P_x(y) = y - <x, y> x.

With kappa = beta |B^T x| and u = B^T x / |B^T x| the kernel is exp(kappa <u, y>): a von Mises-Fisher
kernel in y centred at u (not at x). All numerical kernels are in :mod:`spherepde.kernels.attention`.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field

import numba
import numpy as np

from .._checks import as_matrix, as_points, finite_float, real_array
from ..kernels import attention as _k
from ..kernels import funk_hecke as _fh
from ..kernels.fastexp import EXP_FLOOR
from .base import Model, tangent_project

__all__ = ["Attention", "METHODS", "SourceBlocks"]

log = logging.getLogger(__name__)

#: Largest degree of the spectral path (beyond it the method is not competitive).
SPECTRAL_LMAX = 160
#: "auto" uses the spectral path up to this degree (its cost grows as L^2 per point).
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
#: path (at most N / HEAVY_FRACTION of them).
HEAVY_RATIO = 100.0
HEAVY_FRACTION = 32


@functools.lru_cache(maxsize=16)
def _spectral_tables(L):
    return _k.sph_recurrence(L)

#: Evaluation methods accepted by :class:`Attention`.
METHODS = ("auto", "direct", "pruned", "spectral")
#: Normalisations of the attention mean: the softmax (the paper's) and the unnormalised "USA".
NORMALIZATIONS = ("softmax", "usa")

#: Sources per block and blocks per super-block of the pruned method.
BLOCK = 64
SUPER = 16
#: Largest accepted beta * ||B||_2 (the largest kernel concentration kappa). The kernels were checked
#: finite and exact up to kappa = 1e20; at ~1e50 the log-domain shift of targets far from all mass
#: cancels catastrophically (NaN). No attention model of interest comes near this.
KAPPA_MAX = 1e18

#: Measured throughput of the direct kernel (kernel evaluations per CPU second, AVX2; 0.64-0.84e9 in
#: validation/bench_attention.py since its base-2 two-stage loop), for the cost model of ``method="auto"``.
DIRECT_RATE = 0.7e9
#: Sources summed per CPU second inside the pruned method (its exact block sums), measured at nside 64
#: and 128, beta 100 and 1e3.
PRUNED_RATE = 0.4e9
#: CPU seconds per source (or target) and squared degree of the in-house series (its coefficients; the
#: per-target sums cost ~3.7x this), measured at nside 64, L 45..81.
SERIES_COST = 4.6e-10
#: The fast-transform spectral path (ducc0) is used only where its transform-error model can meet the
#: bound: (1 + sqrt 3) NUFFT_SAFETY EPS_SHT Lebesgue (~2.5) rms/D (~3 for smooth f) <= 0.9 tol.
FAST_SPECTRAL_MIN_TOL = (1.0 + math.sqrt(3.0)) * _fh.NUFFT_SAFETY * _fh.EPS_SHT * 2.5 * 3.0 / 0.9


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
        order = np.arange(N)
        segs = [(0, N)]
        for _ in range(depth):
            nxt = []
            for a, b in segs:
                if b - a < 2:
                    nxt.append((a, b))
                    continue
                idx = order[a:b]
                pts = sources[idx]
                ax = int(np.argmax(pts.max(axis=0) - pts.min(axis=0)))
                half = (b - a) // 2
                part = np.argpartition(pts[:, ax], half)
                order[a:b] = idx[part]
                nxt.append((a, a + half))
                nxt.append((a + half, b))
            segs = nxt
        self.perm = order
        self.S = np.ascontiguousarray(sources[order].T)
        self.bstart = np.array([a for a, _ in segs] + [N], dtype=np.int64)
        nbk = len(segs)
        self.sstart = np.append(np.arange(0, nbk, group), nbk).astype(np.int64)
        pts = sources[order]
        self.bc, self.bcr, self.bsr = self._geometry(pts, self.bstart)
        sb = self.bstart[self.sstart]
        self.sc, self.scr, self.ssr = self._geometry(pts, sb)
        self.bcT = np.ascontiguousarray(self.bc.T)
        self.scT = np.ascontiguousarray(self.sc.T)

    @staticmethod
    def _geometry(pts, starts):
        sums = np.add.reduceat(pts, starts[:-1], axis=0)
        nrm = np.linalg.norm(sums, axis=1)
        c = np.where(nrm[:, None] > 1e-8, sums / np.maximum(nrm, 1e-300)[:, None], pts[starts[:-1]])
        c /= np.linalg.norm(c, axis=1)[:, None]
        owner = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        dots = np.einsum("ij,ij->i", pts, c[owner])
        cr = np.minimum.reduceat(dots, starts[:-1])
        # widen by a rounding margin so that the bound is valid for every point of the cluster
        cr = np.clip(cr - 1e-12, -1.0, 1.0)
        sr = np.sqrt(1.0 - cr * cr)
        return np.ascontiguousarray(c.T), cr, sr

    def log_masses(self, w_sorted: np.ndarray):
        with np.errstate(divide="ignore"):
            bm = np.log(np.add.reduceat(w_sorted, self.bstart[:-1]))
            sm = np.log(np.add.reduceat(w_sorted, self.bstart[self.sstart[:-1]]))
        return bm, sm


@dataclass(frozen=True, eq=False)
class Attention(Model):
    r"""Mean-field self-attention at inverse temperature beta (finite).

    Parameters
    ----------
    B : (d, d) array_like
        Attention matrix B = Q^T K: the score of x for y is <x, B y>. Need not be invertible.
    V : (d, d) array_like
        Value matrix: the velocity is P_x(V m).
    beta : float
        Inverse temperature, finite and >= 0 (beta = inf is :class:`~spherepde.ZeroTemperature`).
    tol : float, default 1e-12
        Guaranteed bound on |m_hat - m| at every target, for the methods "pruned", "spectral"
        and "auto" ("direct" is exact to rounding).
    method : {"auto", "direct", "pruned", "spectral"}, default "auto"
        How the sums are evaluated; "auto" chooses by a cost model.
    normalization : {"softmax", "usa"}, default "softmax"
        "softmax": m is the softmax mean below (the paper's). "usa": the unnormalised self-attention of
        Geshkovski et al. and Bruno et al., m(x) = sum_j w_j y_j e^{beta (<x, B y_j> - s_B)} with
        s_B = sigma_max(B) >= <x, B y>, so every kernel value is in (0, 1] and the field stays finite for any
        beta. This is the raw USA dynamics dx/dt' = P_x(V sum_j w_j y_j e^{beta <x, B y_j>}) in the rescaled
        time t = e^{beta s_B} t' (the rescaling of the literature, e^{beta} for B = I). Evaluated by the
        direct sum (exact to rounding, O(N M)): ``tol`` and ``method`` do not apply.

    Notes
    -----
    For sources y_j on S^(d-1) with weights w_j >= 0 (cell centres and f_j |C_j| on a grid),

    .. math:: m_\beta(x) = \frac{\sum_j y_j e^{\beta\langle x, B y_j\rangle} w_j}
                               {\sum_j e^{\beta\langle x, B y_j\rangle} w_j},
              \qquad v_\beta(x) = P_x(V m_\beta(x)).

    Since |m| <= 1, |v| <= sigma_max(V). Every method shifts the exponents,
    beta <x, B y> - kappa = -kappa |u - y|^2 / 2 <= 0 (kappa = beta |B^T x|, u = B^T x / |B^T x|),
    so nothing overflows, and redoes a target in the log domain (shift max_j(log w_j - kappa |u - y_j|^2
    / 2)) where the shifted sum underflows, so no NaN or inf arises for any weights >= 0.

    Methods:

    - ``"direct"``: O(N M), exact to rounding (the reference).
    - ``"pruned"``: sources in compact blocks (recursive coordinate bisection, any d); a block of
      mass M_k, centre c_k and angular radius r_k contributes at most
      M_k exp(kappa (cos(max(angle(u, c_k) - r_k, 0)) - 1)); blocks are summed exactly unless their
      bound is below eps D_1 / (number of blocks), D_1 <= D a partial sum, so the skipped mass is
      <= eps D and |m_hat - m| <= 2 eps with eps = 0.45 tol. Rigorous. Fast for large kappa
      (cost ~ (log(N / eps) + 3) / kappa of direct).
    - ``"spectral"`` (d = 3): Funk-Hecke series
      exp(kappa <u, y>) = sum_l (2l + 1) i_l(kappa) P_l(<u, y>) truncated at degree L, with the source
      moments of w, w y computed once and the series summed at each target for its own kappa (so any
      B, no interpolation in kappa). Per target the bound (1 + sqrt 3) delta / D_hat is computed, with
      delta = ||w_light||_1 tail_L(kappa) (rigorous truncation bound) plus a rounding model
      (8 eps sqrt(L + 1) (a-posteriori absolute sum + ||w_light||_2 sqrt(2L + 1)); a model, it
      over-estimates the measured rounding errors 20-70 times). Targets whose bound exceeds 0.9 tol
      are recomputed by "pruned" or "direct". The heaviest sources (> 100 x the median weight, at most
      N / 32) are summed directly so that concentrated densities stay on the fast path.
      Where tol >= FAST_SPECTRAL_MIN_TOL (~6e-11), N M > 4e6 and L > 40, "spectral" instead uses the
      fast transforms of :mod:`spherepde.kernels.funk_hecke` (ducc0): targets binned by kappa,
      Chebyshev interpolation in kappa with a rigorous interpolation and truncation bound plus a
      transform-error model (margin >= 20 over measured errors). Its flagged targets (low D: far
      from the bulk of the mass, where the transform error, ~EPS_SHT x the map's rms, is large
      relative to D) go first to the in-house series above where that is cheaper by a cost model
      (its rounding model is ~1e3 tighter, so it takes most of them), then to "pruned" or
      "direct". (Below that tol the transform error model cannot meet the bound.)
    - ``"auto"``: direct for N M <= 4e6. Where the fast spectral path is allowed (tol >= ~6e-11):
      the cheapest of direct, pruned and spectral by a CPU-time model. Otherwise pruned when kappa is
      large enough to prune (median kappa > 2 (log(N / 64 / tol) + 3)); else spectral when d = 3 and
      L <= 64; else direct.
    """

    B: np.ndarray
    V: np.ndarray
    beta: float
    tol: float = 1e-12
    method: str = "auto"
    normalization: str = "softmax"
    dim: int = field(init=False)
    _cache: dict = field(init=False, repr=False, default_factory=dict)

    steady = False
    local = False

    def __post_init__(self):
        try:
            b = float(self.beta)
        except (TypeError, ValueError):
            raise TypeError(f"beta must be a real number, got {self.beta!r}") from None
        if b == np.inf:
            raise ValueError("beta = inf is the zero-temperature limit: use spherepde.ZeroTemperature(B, V)")
        b = finite_float(b, "beta", low=0.0)
        B = as_matrix(self.B, "B")
        V = as_matrix(self.V, "V", d=B.shape[0])
        tol = finite_float(self.tol, "tol", low=0.0, low_open=True, high=0.1)
        kmax = b * float(np.linalg.norm(B, 2))
        if kmax > KAPPA_MAX:
            raise ValueError(
                f"beta * ||B||_2 = {kmax:.3e} exceeds {KAPPA_MAX:.0e}: the kernel concentrations kappa = "
                "beta |B^T x| are beyond the range where the shifted exponents keep their accuracy (far "
                "from all mass their log-domain shift cancels); allowed: beta >= 0 with beta * ||B||_2 <= "
                f"{KAPPA_MAX:.0e} (beta = inf: use spherepde.ZeroTemperature)")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        object.__setattr__(self, "B", B)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "beta", b)
        object.__setattr__(self, "tol", tol)
        object.__setattr__(self, "dim", B.shape[0])

    # ------------------------------------------------------------------ helpers
    def _centres(self, targets):
        bx = targets @ self.B  # rows: B^T x
        s = np.linalg.norm(bx, axis=1)
        kappa = self.beta * s
        ok = s > 0
        if ok.all():
            return np.ascontiguousarray(bx / s[:, None]), kappa
        U = np.zeros_like(bx)
        U[ok] = bx[ok] / s[ok, None]
        U[~ok, 0] = 1.0
        kappa[~ok] = 0.0
        return np.ascontiguousarray(U), kappa

    def _blocks(self, sources) -> SourceBlocks:
        sb = self._cache.get("blocks")
        if sb is None or sb.key.shape != sources.shape or not np.array_equal(sb.key, sources):
            sb = SourceBlocks(sources)
            self._cache["blocks"] = sb
        return sb

    def _pruned_fraction(self, kappa, N):
        """Estimated fraction of the N sources the pruned method sums for these targets:
        (log(nb / eps) + 3) / kappa at the median kappa (research note)."""
        return (math.log(max(N / BLOCK, 1.0) / self.tol) + 3.0) / max(float(np.median(kappa)), 1e-300)

    def _prefer_pruned(self, kappa, N):
        # pruned sums the fraction above at about half the speed per source of the direct kernel
        return self._pruned_fraction(kappa, N) < 0.5

    def _fast_spectral_ok(self):
        return self.dim == 3 and _fh.available() and self.tol >= FAST_SPECTRAL_MIN_TOL

    def _fast_plan(self, kappa, cost_cap=math.inf):
        """(estimated CPU seconds, plan, sorting order) of the fast-transform spectral path; with a
        ``cost_cap`` (the cost of another method), (inf, None, order) if it cannot be cheaper (not kept)."""
        key = ("fast_plan", kappa.shape[0], float(kappa.min()), float(kappa.max()), float(kappa.sum()))
        hit = self._cache.get("fast_plan")
        if hit is not None and hit[0] == key:
            return hit[1]
        hit = self._cache.get("fast_plan_capped")
        if hit is not None and hit[0] == (key, cost_cap):
            return hit[1]
        order = np.argsort(kappa, kind="stable")
        ks = kappa[order]
        goal = 0.1 * self.tol / (2.8 * (2.0 * float(ks[-1]) + 1.0))
        cost, bins = _fh.plan(ks, goal, SPECTRAL_LMAX_FAST, cost_cap)
        res = (cost, bins, order)
        if bins is not None or not math.isfinite(cost_cap):
            self._cache["fast_plan"] = (key, res)
        else:  # not built because another method is cheaper: a plan asked for without a cap is made anew
            self._cache["fast_plan_capped"] = ((key, cost_cap), res)
        return res

    def _choose(self, kappa, N, M):
        """The method "auto" uses for these targets (kappa) and N sources."""
        if N * M <= 4e6:
            return "direct"
        if self._fast_spectral_ok():
            # CPU-second estimates: direct, pruned (fraction (log(nb / eps) + 3) / kappa of the sources,
            # plus the block bounds), fast spectral (its plan's model, + the fallback it may need)
            t_direct = N * M / DIRECT_RATE
            frac = min(1.0, 1.2 * self._pruned_fraction(kappa, N))
            t_pruned = N * M * frac / PRUNED_RATE + M * (N / (BLOCK * SUPER)) * 2e-9
            t_spec = self._fast_plan(kappa, min(t_direct, t_pruned) / 1.3)[0] * 1.3 + 0.02
            best = min(t_direct, t_pruned, t_spec)
            return "direct" if best == t_direct else ("pruned" if best == t_pruned else "spectral")
        if self._prefer_pruned(kappa, N):
            return "pruned"
        L = self.spectral_degree(float(kappa.max()))[0] if self.dim == 3 else SPECTRAL_AUTO_LMAX + 1
        if L <= SPECTRAL_AUTO_LMAX:
            # The series pays off unless its bound fails at most targets, which the direct sums then redo:
            # far from a concentrated density (narrow clusters: 94 % of the targets flagged at beta 30,
            # measured) it costs the direct sums and the series. The fraction it passed the last time
            # (remembered, like the fast path's, and part of get_state) weighs the choice; with no history,
            # or all passed, it is the series as before.
            passed = self._cache.get("series_pass", 1.0)
            if passed < 1.0:
                t_series = (N + 3.7 * M) * (L + 1) ** 2 * SERIES_COST
                if t_series >= passed * (N * M / DIRECT_RATE):  # series + its fallback cost more than direct
                    self._cache["series_pass"] = min(1.0, passed + 0.05)  # drift back: try it again later
                    return "direct"
            self._cache["series_memory"] = True  # the pass fraction of this call is remembered
            return "spectral"
        return "direct"

    # ------------------------------------------------------------------ public API
    def get_state(self) -> dict:
        """The fast path's memory of how often the in-house series passed its flagged targets (it picks
        between methods that agree to ``tol``, so the next field depends on it in the last bits)."""
        return {"series_pass": self._cache["series_pass"]} if "series_pass" in self._cache else {}

    def set_state(self, state: dict):
        """Restore :meth:`get_state`."""
        if "series_pass" in state:
            self._cache["series_pass"] = float(state["series_pass"])
        else:
            self._cache.pop("series_pass", None)

    def mean_field(self, targets, sources, weights, method=None) -> np.ndarray:
        """Softmax-attention mean m_beta at ``targets`` for the discrete measure sum_j w_j delta_{y_j}.

        Parameters
        ----------
        targets : (M, d) array_like
            Points x_i (unit vectors).
        sources : (N, d) array_like
            Points y_j on the unit sphere (renormalised to unit length).
        weights : (N,) array_like
            Weights w_j >= 0, not all zero (a density times cell areas).
        method : str, optional
            Overrides ``self.method`` for this call.

        Returns
        -------
        (M, d) ndarray
            m_beta(x_i), with |m_hat - m| <= tol at every target (rounding for "direct").
        """
        d = self.dim
        x = as_points(targets, d, "targets")
        y = as_points(sources, d, "sources")
        w = real_array(weights, "weights")
        if w.shape != (y.shape[0],):
            raise ValueError(f"weights must have shape ({y.shape[0]},), got {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("weights must be finite and >= 0")
        if not np.any(w > 0):
            raise ValueError("weights are all zero: the attention mean of the zero measure is undefined")
        ny = np.linalg.norm(y, axis=1)
        if np.any(ny == 0):
            raise ValueError("sources must be points of the unit sphere (found a zero vector)")
        y = y / ny[:, None]
        if not np.all(w > 0):  # a source of weight 0 adds exactly 0 to both sums: left out (a density that
            keep = w > 0       # has collapsed into clusters is 0 on most cells, to the last bit)
            y, w = y[keep], w[keep]
        M, N = x.shape[0], y.shape[0]
        out = np.empty((M, d))
        if M == 0:
            return out
        if self.normalization == "usa":
            return self._usa_mean(x, y, w, out)
        U, kappa = self._centres(x)
        meth = self.method if method is None else method
        if meth not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {meth!r}")
        if meth == "auto":
            meth = self._choose(kappa, N, M)
        self._cache["method"] = meth
        with np.errstate(divide="ignore"):
            if meth == "direct":
                S = np.ascontiguousarray(y.T)
                lw = np.log(w)
                if d == 3:
                    _k.direct3(U, kappa, S, w, lw, out)
                else:
                    _k.direct_nd(U, kappa, S, w, lw, out)
            elif meth == "pruned":
                self._pruned(U, kappa, y, w, out)
            else:
                if d != 3:
                    raise ValueError("method 'spectral' is implemented for d = 3 only")
                if (self._fast_spectral_ok() and M * N > FAST_SPECTRAL_MIN_WORK
                        and self.spectral_degree(float(kappa.max()))[0] > SPECTRAL_INHOUSE_LMAX):
                    self._cache["spectral_path"] = "fast"
                    self._spectral_fast(U, kappa, y, w, out)
                else:
                    self._cache["spectral_path"] = "inhouse"
                    self._spectral(U, kappa, y, w, out)
                    if self._cache.pop("series_memory", False):  # chosen by "auto": remember how it did
                        self._cache["series_pass"] = 1.0 - self._cache["spectral_flagged"] / M
        if not np.all(np.isfinite(out)):  # never pass a NaN field on as if the density were at fault
            raise FloatingPointError(f"the attention method {meth!r} gave a non-finite mean field (a bug in "
                                     "spherepde: please report it with the inputs); method='direct' is exact")
        return out

    @property
    def usa_shift(self) -> float:
        """s_B = sigma_max(B), the shift of the USA exponents (so that beta (<x, B y> - s_B) <= 0)."""
        return float(np.linalg.norm(self.B, 2))

    def _usa_mean(self, x, y, w, out):
        """m(x_i) = sum_j w_j y_j exp(beta (<x_i, B y_j> - s_B)): the softmax mean times its normaliser
        exp(lse_i - beta s_B) <= sum_j w_j (the kernel of the particle code: one pass, no overflow)."""
        from ..kernels.particles import launch, softmax_mean

        self._cache["method"] = "direct"
        lse = np.empty(x.shape[0])
        with np.errstate(divide="ignore"):
            lw = np.log(w)
        launch(softmax_mean, x.shape[0] * y.shape[0], np.ascontiguousarray(x), np.ascontiguousarray(y.T), lw,
               np.ascontiguousarray(self.B), self.beta, out, lse)
        out *= np.exp(lse - self.beta * self.usa_shift)[:, None]
        if not np.all(np.isfinite(out)):
            raise FloatingPointError("the USA attention gave a non-finite mean field (a bug: please report it)")
        return out

    def spectral_degree(self, kappa_max: float) -> tuple[int, int]:
        """Degree L of the Funk-Hecke series for concentrations up to ``kappa_max``, and the number of
        extra backward-recurrence terms. The tail at L is <= 0.1 tol / (2.8 (2 kappa_max + 1)): for a
        density within a factor 10 of uniform the truncation alone then stays below tol."""
        if kappa_max == 0.0:
            return 0, 30
        if kappa_max > SPECTRAL_LMAX:  # the degree needed exceeds SPECTRAL_LMAX (L ~ kappa + 8 sqrt(kappa))
            return SPECTRAL_LMAX + 1, 30
        ext = max(30, int(kappa_max) + 30)
        goal = 0.1 * self.tol / (2.8 * (2.0 * kappa_max + 1.0))
        L = int(kappa_max) // 2
        while L <= SPECTRAL_LMAX and _k.sph_tail(kappa_max, L, ext) > goal:
            L += 1
        return L, ext

    def _heavy_split(self, w):
        """Sources summed directly (weights > HEAVY_RATIO x the median positive weight, at most
        N / HEAVY_FRACTION of them) and the light weights left to the series."""
        N = w.shape[0]
        pos = w[w > 0]
        heavy = w > HEAVY_RATIO * np.median(pos)
        if heavy.sum() > N // HEAVY_FRACTION:
            heavy = np.zeros(N, dtype=bool)
            heavy[np.argpartition(w, N - N // HEAVY_FRACTION)[N - N // HEAVY_FRACTION:]] = True
        return heavy, np.where(heavy, 0.0, w)

    def _spectral_fast(self, U, kappa, y, w, out):
        """Fast-transform Funk-Hecke path (ducc0, Chebyshev interpolation in kappa); targets whose
        bound (1 + sqrt 3) delta / D_hat exceeds 0.9 tol are recomputed by a guaranteed method."""
        M = U.shape[0]
        cost, bins, order = self._fast_plan(kappa)
        if bins is None:
            self._cache["spectral_flagged"] = M
            return self._fallback(np.ones(M, dtype=bool), U, kappa, y, w, out)
        heavy, wl = self._heavy_split(w)
        F, delta = _fh.spectral_sums(U, kappa, y, wl, bins, order, numba.get_num_threads(), cache=self._cache)
        delta = delta + self._add_heavy(heavy, U, kappa, y, w, F, delta)
        eps = np.finfo(float).eps
        D = F[:, 0]
        delta = delta + 64.0 * eps * np.abs(D)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = (1.0 + math.sqrt(3.0)) * delta / D
        ok = (D > 1e-250) & (bound <= 0.9 * self.tol)
        out[ok] = F[ok, 1:] / D[ok, None]
        bad = ~ok
        L = max(b[4] for b in bins)
        self._cache["spectral_flagged_fast"] = int(bad.sum())
        self._cache["spectral_flagged"] = int(bad.sum())
        self._cache["spectral_plan"] = [(b[2], b[3], b[4], b[5], b[1] - b[0]) for b in bins]
        self._cache["spectral_heavy"] = int(heavy.sum())
        self._series_then_fallback(bad, U, kappa, y, w, out)
        self._cache["spectral_degree"] = L
        return out

    @staticmethod
    def _add_heavy(heavy, U, kappa, y, w, F, delta):
        """Adds the direct sums of the heavy sources to F (M, 4), at the targets where they can matter;
        returns the error bound (M,) this adds to each of the four sums, given the bound ``delta`` (M,)
        of the rest.

        The heavy sources lie in a cap (centre c, angular radius r); at a target whose kernel centre u
        is at angle theta from c, every heavy term is <= w_j exp(kappa (cos(max(theta - r, 0)) - 1))
        (and |y| = 1 bounds the numerator terms alike), so the heavy sums are <= that times sum w_j.
        Where this is <= 1e-3 delta (far from a concentrated density) the sums are skipped and the
        bound (doubled, for the rounding of the angles) is added instead: the error bound grows by at
        most 0.1%. Elsewhere: the direct sums, whose exp floor adds <= 2.6e-261 sum w_j."""
        M = F.shape[0]
        if not heavy.any():
            return np.zeros(M)
        yh = y[heavy]
        wh = np.ascontiguousarray(w[heavy])
        wsum = float(wh.sum())
        extra = np.full(M, math.exp(EXP_FLOOR) * wsum)
        todo = np.ones(M, dtype=bool)
        c = wh @ yh
        nc = float(np.linalg.norm(c))
        if nc > 0.0:
            c = c / nc
            r = math.acos(min(1.0, max(-1.0, float((yh @ c).min())))) + 1e-12
            theta = np.arccos(np.clip(U @ c, -1.0, 1.0))
            cap = 2.0 * wsum * np.exp(kappa * (np.cos(np.maximum(theta - r, 0.0)) - 1.0))
            skip = cap <= 1e-3 * delta
            extra[skip] = cap[skip]
            todo = ~skip
        if todo.any():
            sel = slice(None) if todo.all() else todo  # all: no copies of U and kappa
            Uh, kh = np.ascontiguousarray(U[sel]), np.ascontiguousarray(kappa[sel])
            Fh = np.empty((kh.shape[0], 4))
            _k.direct3_sums(Uh, kh, np.ascontiguousarray(yh.T), wh, Fh)
            F[sel] += Fh
        return extra

    def _series_then_fallback(self, bad, U, kappa, y, w, out):
        """Targets flagged by the fast path: the in-house series first where it is expected to be
        cheaper than the guaranteed sums (its rounding model is ~1e3 tighter than the transform-error
        model, so it takes most targets of low D while the density is smooth), then pruned / direct for
        what it flags in turn.

        The series pays off only if it passes enough of these targets; far from a concentrated density it
        passes few (its own bound fails there too). The fraction it passed the last time is remembered
        (the field is evaluated again and again on a slowly changing density) and weighs the choice."""
        nb_ = int(bad.sum())
        if nb_ == 0:
            return out
        N = y.shape[0]
        kb = kappa[bad]
        L = self.spectral_degree(float(kb.max()))[0]
        # CPU seconds (measured on the 2-core machine at nside 64, L 45..81): the series' source
        # coefficients N L^2 and per-target sums nb L^2 (~3.7x the cost per point); the guaranteed sums
        # by the same estimates as "auto"
        t_series = (N + 3.7 * nb_) * (L + 1) ** 2 * SERIES_COST
        frac = self._pruned_fraction(kb, N)
        t_exact = nb_ * N * (frac / PRUNED_RATE if frac < 0.5 else 1.0 / DIRECT_RATE)  # as _prefer_pruned
        passed = self._cache.get("series_pass", 1.0)
        if L <= SPECTRAL_LMAX and t_series < passed * t_exact:
            idx = np.nonzero(bad)[0]
            sub = np.empty((nb_, 3))
            self._spectral(np.ascontiguousarray(U[idx]), np.ascontiguousarray(kb), y, w, sub)
            out[idx] = sub
            self._cache["series_pass"] = 1.0 - self._cache["spectral_flagged"] / nb_
            return out
        # not tried: drift back towards trying it, so that a density that smooths out again gets it
        self._cache["series_pass"] = min(1.0, passed + 0.05)
        self._cache["spectral_flagged"] = nb_
        return self._fallback(bad, U, kappa, y, w, out)

    def _spectral(self, U, kappa, y, w, out):
        """Funk-Hecke evaluation with a per-target error bound; flagged targets are recomputed.

        The few heaviest sources (weights > HEAVY_RATIO x the median positive weight, at most
        N / HEAVY_FRACTION of them) are summed directly; the series carries only the light rest, whose
        error scales with its own (small) mass: this keeps concentrated densities on the fast path.
        """
        kmax = float(kappa.max())
        L, ext = self.spectral_degree(kmax)
        N = y.shape[0]
        M = U.shape[0]
        if L > SPECTRAL_LMAX:  # kappa too large for the series: everything goes to the fallback
            self._cache["spectral_flagged"] = M
            return self._fallback(np.ones(M, dtype=bool), U, kappa, y, w, out)
        off, ra, rb, pmm = _spectral_tables(L)
        pos = w[w > 0]
        heavy = w > HEAVY_RATIO * np.median(pos)
        if heavy.sum() > N // HEAVY_FRACTION:
            heavy = np.zeros(N, dtype=bool)
            heavy[np.argpartition(w, N - N // HEAVY_FRACTION)[N - N // HEAVY_FRACTION:]] = True
        wl = np.where(heavy, 0.0, w)
        C = _k.sph_coeffs(np.ascontiguousarray(y.T), wl, L, off, ra, rb, pmm)
        R = np.sqrt(C[0::2] ** 2 + C[1::2] ** 2).max(axis=0)
        # targets sorted by kappa, each chunk of 128 summed to the degree its largest kappa needs
        order = np.argsort(kappa, kind="stable")
        Us, ks = np.ascontiguousarray(U[order]), np.ascontiguousarray(kappa[order])
        ch = _k._CH
        kc = ks[np.minimum(np.arange(ch - 1, M + ch - 1, ch), M - 1)]
        lo = max(float(kc.min()), 1e-3)
        grid = np.unique(np.concatenate([np.geomspace(lo, kmax, 24), [kmax]])) if kmax > lo else np.array([kmax])
        degs = np.array([self.spectral_degree(float(g))[0] for g in grid])
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
        eps = np.finfo(float).eps
        # truncation: rigorous (|P_l| <= 1, |y| = 1, so each of the four maps is off by <= ||w||_1 tail).
        # rounding: a model, not a proof: 8 eps sqrt(L + 1) times the a-posteriori absolute sum of the
        # target series plus the propagated source-moment noise ||w||_2 sqrt(2L + 1) (random-walk
        # accumulation over the L + 1 degrees; it over-estimates the measured errors 20-70 times).
        delta = w1 * tail + 8.0 * eps * math.sqrt(L + 1) * (absum + w2 * math.sqrt(2 * L + 1))
        delta = delta + self._add_heavy(heavy, U, kappa, y, w, F, delta)
        # heavy part: direct sums, relative rounding ~ 1e-16 x (terms): counted as 64 eps D
        D = F[:, 0]
        delta = delta + 64.0 * eps * np.abs(D)
        with np.errstate(divide="ignore", invalid="ignore"):
            # m_hat - m = (N_hat - N) / D_hat + m (D - D_hat) / D_hat, |N_hat - N| <= sqrt(3) delta
            bound = (1.0 + math.sqrt(3.0)) * delta / D
        ok = (D > 1e-250) & (bound <= 0.9 * self.tol)
        out[ok] = F[ok, 1:] / D[ok, None]
        bad = ~ok
        self._cache["spectral_flagged"] = int(bad.sum())
        self._cache["spectral_degree"] = L
        self._cache["spectral_heavy"] = int(heavy.sum())
        return self._fallback(bad, U, kappa, y, w, out)

    def _fallback(self, bad, U, kappa, y, w, out):
        """Recompute the targets flagged by the spectral bound with a guaranteed method."""
        N = y.shape[0]
        if bad.any():
            sub = np.empty((int(bad.sum()), 3))
            Ub, kb = np.ascontiguousarray(U[bad]), np.ascontiguousarray(kappa[bad])
            if self._prefer_pruned(kb, N):
                self._pruned(Ub, kb, y, w, sub)
            else:
                _k.direct3(Ub, kb, np.ascontiguousarray(y.T), w, np.log(w), sub)
            out[bad] = sub
        return out

    def _pruned(self, U, kappa, y, w, out):
        sb = self._blocks(y)
        ws = w[sb.perm]
        with np.errstate(divide="ignore"):
            lw = np.log(ws)
        blogm, slogm = sb.log_masses(ws)
        nsum = np.empty(U.shape[0], dtype=np.int64)
        # |m_hat - m| <= 2 eps / (1 - eps); the factor 0.45 leaves room for rounding
        eps = 0.45 * self.tol
        if self.dim == 3:
            _k.pruned3(U, kappa, sb.S, ws, lw, sb.bstart, sb.bc, sb.bcr, sb.bsr, blogm,
                       sb.sstart, sb.sc, sb.scr, sb.ssr, slogm, eps, out, nsum)
        else:
            _k.pruned(U, kappa, sb.S, ws, lw, sb.bstart, sb.bc, sb.bcr, sb.bsr, blogm,
                      sb.sstart, sb.sc, sb.scr, sb.ssr, slogm, eps, out, nsum)
        self._cache["last_nsum"] = nsum
        return out

    def velocity_from_mean(self, points, m) -> np.ndarray:
        """v = P_x(V m) at ``points`` (n, d) for attention means ``m`` (n, d)."""
        x = as_points(points, self.dim)
        m = as_points(m, self.dim, "m")
        return tangent_project(x, m @ self.V.T)

    def velocity_measure(self, points, sources, weights) -> np.ndarray:
        """Velocity at ``points`` (n, d) for the measure sum_j weights_j delta_{sources_j}."""
        return self.velocity_from_mean(points, self.mean_field(points, sources, weights))

    def velocity(self, points, grid, density) -> np.ndarray:
        """Velocity at ``points`` (n, d) for a grid density: sources = cell centres, weights = f |C|."""
        dens = np.asarray(density, dtype=float)
        return self.velocity_measure(points, grid.centers, dens * grid.areas)

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        if grid is None or density is None:
            raise ValueError("the attention field is nonlocal: field() needs the grid and the density")
        return self.velocity(points, grid, density)

    def speed_bound(self) -> float:
        # |P_x(V m)| <= |V m| <= sigma_max(V) |m|; |m| <= 1 (softmax: a convex combination of unit vectors;
        # USA: kernel values <= 1, for a probability measure)
        return float(np.linalg.norm(self.V, 2))
