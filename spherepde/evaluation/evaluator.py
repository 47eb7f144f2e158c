"""The evaluator of the attention mean: the method choice, the fallback chain and the info object.

An :class:`AttentionEvaluator` belongs to one :class:`~spherepde.Attention` model (which holds only its
physical parameters and options) and to one run: the solver keeps one per attention head. It owns

- the choice of method (``method="auto"``: a CPU-time cost model over the registry),
- the fallback chain (:meth:`AttentionEvaluator.next_method`: where the targets a method refuses go;
  the one place that decides it),
- its caches (``cache``: source blocks, fast-transform plans and tables; memos of the inputs, which never
  change a result) and its ``memory`` (how often the in-house series passed its targets the last time:
  it steers the next choice between methods that agree to ``tol``, so it is state, checkpointed by the
  solver through :meth:`get_state`),

and returns every field with a :class:`FieldInfo` (the methods that ran, on how many targets, what they
refused, the largest certified error bound) instead of writing hidden state.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np

from .._checks import as_points, real_array
from . import methods as _m
from .methods import REGISTRY, Targets

__all__ = ["AttentionEvaluator", "FieldInfo", "METHODS", "kernel_centres", "selectable_methods"]

#: The documented values of ``Attention.method``: "auto" chooses by cost, "spectral" is the series
#: (in-house or by fast transforms, by size and degree). The registry's selectable methods
#: (:func:`selectable_methods`: "series", "fast_spectral", ...) can be asked for by name too.
METHODS = ("auto", "direct", "pruned", "spectral")


#: "auto" skips the fast transforms for FAST_SKIP_EVALS evaluations after they refused at least the fraction
#: FAST_SKIP_REFUSED of an evaluation's targets (all of them refused on tokens in clusters; the attempt
#: cost 0.04-0.4 s of a ~1 s evaluation at n = 1e5, validation/bench_particles.md), then tries them again.
FAST_SKIP_REFUSED = 0.99
FAST_SKIP_EVALS = 9


def selectable_methods() -> tuple:
    """The values ``method`` takes: :data:`METHODS` and the registry's methods that can be asked for by
    name (``"series"``, ``"fast_spectral"`` and any registered later)."""
    return METHODS + tuple(n for n, m in REGISTRY.items() if m.selectable and n not in METHODS)


@dataclass
class FieldInfo:
    """What one evaluation did (the POT ``log`` idea: returned, not stored in the model).

    Attributes
    ----------
    method : str
        The registry name of the method that ran first, on all targets ("direct", "pruned", "series",
        "fast_spectral", "circle_fft", "usa_direct").
    bound : float
        The largest certified bound on |m_hat - m| over the targets (<= the model's ``tol``); 0.0 where
        only rounding errors remain (direct sums).
    chain : list of (str, int, int)
        (method, targets it was given, targets it refused) for every method that ran, in order.
    n_targets, n_sources : int
        The problem's size (sources of weight 0 are left out before any method runs).
    degree, heavy, plan, nsum :
        Spectral degree, number of heavy sources summed directly, the fast path's kappa bins, and the
        pruned method's sources summed per target (None where the method did not run).
    """

    method: str = ""
    bound: float = 0.0
    chain: list = field(default_factory=list)
    n_targets: int = 0
    n_sources: int = 0
    degree: int | None = None
    heavy: int | None = None
    plan: list | None = None
    nsum: np.ndarray | None = None

    def note(self, name: str, n: int, bound: float, refused: int = 0):
        """Record a method's run (its bound over the targets it accepted)."""
        if not self.method:
            self.method = name
        self.chain.append((name, int(n), int(refused)))
        self.bound = max(self.bound, float(bound))

    def refused(self, name: str) -> int:
        """Targets the method ``name`` refused (summed over its runs)."""
        return sum(r for m, _, r in self.chain if m == name)

    @property
    def methods(self) -> tuple:
        """The methods that ran, in order."""
        return tuple(m for m, _, _ in self.chain)


def kernel_centres(model, targets):
    """(U, kappa): the kernel centres u = B^T x / |B^T x| (rows) and concentrations kappa = beta |B^T x|
    (u = e_1, kappa = 0 where B^T x = 0)."""
    bx = targets @ model.B  # rows: B^T x
    s = np.linalg.norm(bx, axis=1)
    kappa = model.beta * s
    ok = s > 0
    if ok.all():
        return np.ascontiguousarray(bx / s[:, None]), kappa
    U = np.zeros_like(bx)
    U[ok] = bx[ok] / s[ok, None]
    U[~ok, 0] = 1.0
    kappa[~ok] = 0.0
    return np.ascontiguousarray(U), kappa


class AttentionEvaluator:
    """Evaluates the attention mean of one model with its certified bound (see the module docstring).

    Parameters
    ----------
    model : spherepde.Attention
    """

    def __init__(self, model):
        self.model = model
        self.cache: dict = {}
        self.memory: dict = {}

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        """The memory of how often the in-house series passed its targets and of how many more evaluations
        skip the fast transforms (it picks between methods that agree to ``tol``, so the next field depends
        on it in the last bits)."""
        return {k: self.memory[k] for k in ("series_pass", "fast_skip") if k in self.memory}

    def set_state(self, state: dict):
        """Restore :meth:`get_state` (``{}``: a fresh history)."""
        for k, kind in (("series_pass", float), ("fast_skip", int)):
            if k in state:
                self.memory[k] = kind(state[k])
            else:
                self.memory.pop(k, None)

    # ------------------------------------------------------------------ the choice
    def _spectral_entry(self, p: Targets) -> str:
        """The series path of ``method="spectral"``: the fast transforms where they are allowed, the problem
        is large and the degree high; the in-house series otherwise."""
        if (_m.FastSpectral.allowed(self) and p.M * p.N > _m.FAST_SPECTRAL_MIN_WORK
                and _m.spectral_degree(self.model.tol, float(p.kappa.max()))[0] > _m.SPECTRAL_INHOUSE_LMAX):
            return "fast_spectral"
        return "series"

    def _exact(self, p: Targets, tree: bool = True) -> str:
        """The guaranteed method for these targets: pruned where kappa is large enough to prune (it sums
        the fraction :func:`~spherepde.evaluation.methods.pruned_fraction` of the sources at about half the
        direct kernel's speed per source), direct otherwise; the USA's direct sums for the USA. With
        ``tree``, the dual tree instead where its planned cost is lower (:meth:`_tree_or`)."""
        if self.model.normalization == "usa":
            return "usa_direct"
        name = "pruned" if _m.pruned_fraction(self.model.tol, p) < 0.5 else "direct"
        if name == "pruned" and REGISTRY["pruned"].cost(self, p) > REGISTRY["direct"].cost(self, p):
            name = "direct"  # (few targets on sources without blocks yet: making them costs more than it saves)
        return self._tree_or(p, name) if tree else name

    def _tree_or(self, p: Targets, name: str) -> str:
        """``"tree"`` where the dual tree is available and its planned cost (the traversal run in count
        mode: ~1% of its work) is below the cost of the guaranteed method ``name``; ``name`` otherwise. The
        plan is made only where ``name`` costs more than three times the tree's set-up (both trees and
        the leaves' bounds, ~1.5 us a point) and more than TREE_MIN_SECONDS: for a spread-out density
        the tree only prunes, and the planning would be the price of every evaluation."""
        if name not in ("direct", "pruned") or REGISTRY["tree"].available(self) is not None:
            return name
        t_name = REGISTRY[name].cost(self, p)
        if p.N * p.M < _m.TREE_MIN_WORK or t_name < max(_m.TREE_MIN_SECONDS, 3 * _m.TREE_SETUP * (p.N + p.M)):
            return name
        # no margin: the tree's model is within 1.0-1.3x of its measured CPU time on tokens, spread out or in
        # clusters, and the pruned method's within 1.0-1.4x on spread-out ones, but up to 2x low on clustered
        # ones (its block bounds; n = 1e5, beta 100-200, tol 1e-12, measured 2026-12-06). Before the pruned
        # model's recalibration (PRUNED_RATE, pruned_fraction) it over-estimated 3-5x and this margin was 2.
        if REGISTRY["tree"].cost(self, p) < t_name:
            return "tree"
        self.cache.pop("tree", None)  # the plan is not kept beyond this choice
        return name

    def _usa_first(self, p: Targets, requested: str) -> str:
        """The unnormalised attention: direct sums for small problems, ``method="direct"`` or d != 3; else the
        series (in-house or by fast transforms, as for "spectral"), whose refusals take the direct sums.
        Pruning does not apply (its bound is relative to the softmax normaliser)."""
        if requested in ("pruned", "tree"):
            raise ValueError(f"method {requested!r} does not evaluate the unnormalised attention (normalization='usa'): "
                             "its bound is relative to the softmax normaliser; use 'auto', 'direct' or 'spectral'")
        if requested in ("series", "fast_spectral"):
            return self._first(p, requested)[0]
        if requested == "direct" or self.model.dim != 3 or (requested == "auto" and p.N * p.M <= 4e6):
            return "usa_direct"
        if requested == "auto" and _m.spectral_degree(self.model.tol, float(p.kappa.max()))[0] > _m.SPECTRAL_LMAX \
                and not _m.FastSpectral.allowed(self):
            return "usa_direct"
        return self._spectral_entry(p)

    def choose(self, p: Targets) -> tuple[str, bool]:
        """The method "auto" uses for these targets, and whether the series' pass fraction is remembered."""
        N, M, tol = p.N, p.M, self.model.tol
        if N * M <= 4e6:
            return "direct", False
        if _m.FastSpectral.allowed(self):
            # CPU-second estimates: direct, pruned, fast spectral (its plan's model + the fallback it may need)
            t_direct = REGISTRY["direct"].cost(self, p)
            t_pruned = REGISTRY["pruned"].cost(self, p)
            t_spec = REGISTRY["fast_spectral"].cost(self, p, min(t_direct, t_pruned) / 1.3) * 1.3 + 0.02
            best = min(t_direct, t_pruned, t_spec)
            if best == t_spec and self.memory.get("fast_skip", 0) > 0:
                # the fast transforms refused (nearly) every target of a recent evaluation (tokens in clusters:
                # their bound fails away from the bulk of the mass, and the tokens are all there): skipped
                # for FAST_SKIP_EVALS evaluations, then tried again (see mean_field)
                self.memory["fast_skip"] -= 1
                best = min(t_direct, t_pruned)
            if best == t_spec:
                return self._spectral_entry(p), False
            return self._tree_or(p, "direct" if best == t_direct else "pruned"), False
        if self._exact(p, tree=False) == "pruned":
            exact = self._tree_or(p, "pruned")
            # The in-house series where its model is below the guaranteed sums' (beta ~30-200 on spread-out
            # densities: uniform tokens, n = 1e5, beta 100, tol 1e-12: 0.60 s against the pruned sums' 1.29 s;
            # HEALPix nside 128, a smooth f: 1.42 s against 4.74 s), weighed, as below, by the fraction of
            # the targets it passed the last time (its refusals take the guaranteed sums).
            t_series = REGISTRY["series"].cost(self, p)
            if math.isfinite(t_series) and self._series_pays(t_series, REGISTRY[exact].cost(self, p)):
                self.cache.pop("tree", None)  # the plan is not kept beyond this choice
                return self._spectral_entry(p), True
            return exact, False
        L = _m.spectral_degree(tol, float(p.kappa.max()))[0] if self.model.dim == 3 else _m.SPECTRAL_AUTO_LMAX + 1
        if L <= _m.SPECTRAL_AUTO_LMAX:
            # The series pays off unless its bound fails at most targets, which the direct sums then redo:
            # far from a concentrated density (narrow clusters: 94 % of the targets flagged at beta 30,
            # measured) it costs the direct sums and the series. The fraction it passed the last time
            # (remembered, and part of get_state) weighs the choice; with no history, or all passed, it is
            # the series.
            if self.memory.get("series_pass", 1.0) < 1.0 \
                    and not self._series_pays(REGISTRY["series"].cost(self, p), N * M / _m.DIRECT_RATE):
                return "direct", False
            return self._spectral_entry(p), True
        return self._tree_or(p, "direct"), False

    def next_method(self, name: str, sub: Targets, info: FieldInfo) -> tuple[str, bool]:
        """The fallback chain, in one place: the method that takes the targets ``sub`` that method ``name``
        refused, and whether the series' pass fraction is remembered when it runs.

        - circle_fft (all targets or none) -> the requested method, on the sources of positive weight
          (:meth:`mean_field` takes that path itself);
        - fast_spectral without a plan (kappa beyond every series) -> pruned / direct;
        - series -> pruned / direct (or the dual tree where its plan is cheaper, :meth:`_tree_or`);
        - tree (where tol leaves it no error budget) -> pruned / direct;
        - fast_spectral -> the in-house series where it is expected to be cheaper than the guaranteed sums
          (its rounding model is ~1e3 tighter than the transform-error model, so it takes most targets of
          low D while the density is smooth), weighed by the fraction it passed the last time; else, or
          after the series, pruned / direct.

        The series pays off only if it passes enough of these targets; far from a concentrated density it
        passes few (its own bound fails there too), hence the memory (the field is evaluated again and
        again on a slowly changing density). Not tried: the memory drifts back towards trying it, so that a
        density that smooths out again gets it."""
        exact = self._exact(sub, tree=name != "tree")  # (the tree, if chosen, is planned and kept for sub)
        if name == "fast_spectral" and info.plan is not None:  # (no plan: kappa beyond any series)
            N, nb_ = sub.N, sub.M
            # CPU seconds: the series' cost model (inf beyond its largest degree); the guaranteed sums by
            # the same estimates as "auto"
            t_series = REGISTRY["series"].cost(self, sub)
            frac = _m.pruned_fraction(self.model.tol, sub)
            t_exact = nb_ * N * (frac / _m.pruned_rate(sub) if frac < 0.5 else 1.0 / _m.DIRECT_RATE)
            if exact == "tree":
                t_exact = min(t_exact, REGISTRY["tree"].cost(self, sub))
            if self._series_pays(t_series, t_exact):
                self.cache.pop("tree", None)  # the plan is not kept beyond this choice
                return "series", True
        return exact, False

    def _series_pays(self, t_series: float, t_exact: float) -> bool:
        """Whether the series (modelled CPU seconds ``t_series``) beats the guaranteed sums (``t_exact``) once
        the targets it refuses, which they then take, are counted: t_series < passed t_exact, ``passed`` the
        share of the targets it passed the last time (remembered, part of get_state; 1 with no history). When
        it does not, the remembered share drifts back by 0.05 towards 1, so that a density that smooths out
        again gets the series."""
        passed = self.memory.get("series_pass", 1.0)
        if t_series < passed * t_exact:
            return True
        if passed < 1.0:
            self.memory["series_pass"] = min(1.0, passed + 0.05)
        return False

    def _first(self, p: Targets, requested: str) -> tuple[str, bool]:
        if requested == "auto":
            return self.choose(p)
        if requested == "spectral":
            if self.model.dim != 3:
                raise ValueError("method 'spectral' is implemented for d = 3 only")
            return self._spectral_entry(p), False
        why = REGISTRY[requested].available(self)
        if why is not None:
            raise ValueError(f"method {requested!r} cannot evaluate this model: {why}")
        return requested, False

    def _run(self, name: str, p: Targets, out: np.ndarray, info: FieldInfo, remember: bool):
        """Method ``name`` on the targets p; what it refuses goes down the chain (:meth:`next_method`)."""
        bad = REGISTRY[name].run(self, p, out, info)
        if name == "series" and remember:
            self.memory["series_pass"] = 1.0 - (0 if bad is None else int(bad.sum())) / p.M
        if bad is None or not bad.any():
            return
        sub = p.subset(bad)
        nxt, rem = self.next_method(name, sub, info)
        sub_out = np.empty((sub.M, out.shape[1]))
        self._run(nxt, sub, sub_out, info, rem)
        out[bad] = sub_out

    # ------------------------------------------------------------------ the public call
    def mean_field(self, targets, sources, weights, method: str | None = None, circle_phi0: float | None = None):
        """(m, info): the attention mean at ``targets`` for the measure sum_j w_j delta_{y_j}, with
        |m_hat - m| <= tol at every target (rounding only for "direct"), and its :class:`FieldInfo`.

        ``circle_phi0``: the targets and sources are the cells phi0 + 2 pi j / N of a uniform circle grid,
        in order (the solver's hint): the FFT path is tried first where B is a rotation times a scale.
        See :meth:`spherepde.Attention.mean_field` for the parameters."""
        model = self.model
        d = model.dim
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
        requested = model.method if method is None else method
        if requested not in selectable_methods():
            raise ValueError(f"method must be one of {selectable_methods()}, got {requested!r}")
        y = y / ny[:, None]
        info = FieldInfo()
        M = x.shape[0]
        out = np.empty((M, d))
        if M == 0:
            return out, info
        U, kappa = kernel_centres(model, x)
        if circle_phi0 is not None:
            # all N weights (zeros included): the convolution needs the whole uniform grid. Where its bound
            # fails it refuses every target, which then take the general path below
            p = Targets(x, U, kappa, y, w, circle_phi0)
            if _m.CircleFFT.applies(self, p) and REGISTRY["circle_fft"].run(self, p, out, info) is None:
                info.n_targets, info.n_sources = M, y.shape[0]
                return self._checked(out, info)
        if not np.all(w > 0):  # a source of weight 0 adds exactly 0 to both sums: left out (a density that
            keep = w > 0       # has collapsed into clusters is 0 on most cells, to the last bit)
            y, w = y[keep], w[keep]
        info.n_targets, info.n_sources = M, y.shape[0]
        p = Targets(x, U, kappa, y, w)
        if model.normalization == "usa":
            self._run(self._usa_first(p, requested), p, out, info, False)
            return self._checked(out, info)
        first, remember = self._first(p, requested)
        self._run(first, p, out, info, remember)
        if (requested == "auto" and first == "fast_spectral"
                and info.refused("fast_spectral") >= FAST_SKIP_REFUSED * M):
            self.memory["fast_skip"] = FAST_SKIP_EVALS
        return self._checked(out, info)

    @staticmethod
    def _checked(out, info):
        if not np.all(np.isfinite(out)):  # never pass a NaN field on as if the density were at fault
            raise FloatingPointError(f"the attention method {info.method!r} gave a non-finite mean field (a bug "
                                     "in spherepde: please report it with the inputs); method='direct' is exact")
        return out, info
