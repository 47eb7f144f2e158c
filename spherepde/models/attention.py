"""Finite-temperature model: the softmax-attention mean field m_beta and v = P_x(V m_beta).

Conventions (MODEL.md): score <x, B y> with B = Q^T K, value map y -> V y, so

    m_beta(x) = sum_j y_j exp(beta <x, B y_j>) w_j / sum_j exp(beta <x, B y_j>) w_j,
    v(x) = P_x(V m_beta(x)),   P_x(y) = y - <x, y> x.

With kappa = beta |B^T x| and u = B^T x / |B^T x| the kernel is exp(kappa <u, y>): a von Mises-Fisher
kernel in y centred at u (not at x). How the mean is evaluated (methods, choice, bounds) is
:mod:`spherepde.evaluation`; the Numba kernels are in :mod:`spherepde.kernels.attention`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from .._checks import as_matrix, as_points, finite_float
from ..evaluation import METHODS, AttentionEvaluator, selectable_methods
from ..evaluation import methods as _methods
from .base import Model, tangent_project

__all__ = ["Attention", "METHODS"]

log = logging.getLogger(__name__)

#: Normalisations of the attention mean: the softmax (the paper's) and the unnormalised "USA".
NORMALIZATIONS = ("softmax", "usa")
#: Largest accepted beta * ||B||_2 (the largest kernel concentration kappa). The kernels were checked
#: finite and exact up to kappa = 1e20; at ~1e50 the log-domain shift of targets far from all mass
#: cancels catastrophically (NaN). No attention model of interest comes near this.
KAPPA_MAX = 1e18


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
        How the sums are evaluated; "auto" chooses by a cost model. The registry's methods can be named
        too: "series" (the in-house series only), "fast_spectral" (the fast transforms only), "tree" (the
        dual tree, for tokens or densities in clusters), and any method registered with
        :func:`spherepde.evaluation.register`.
    normalization : {"softmax", "usa"}, default "softmax"
        "softmax": m is the softmax mean below (the paper's). "usa": the unnormalised self-attention of
        Geshkovski et al. and Bruno et al., m(x) = sum_j w_j y_j e^{beta (<x, B y_j> - s_B)} with
        s_B = sigma_max(B) >= <x, B y>, so every kernel value is in (0, 1] and the field stays finite for any
        beta. This is the raw USA dynamics dx/dt' = P_x(V sum_j w_j y_j e^{beta <x, B y_j>}) in the rescaled
        time t = e^{beta s_B} t' (the rescaling of the literature, e^{beta} for B = I). Evaluated by the
        direct sum (exact to rounding, O(N M)) for small problems and ``method="direct"``; otherwise ("auto",
        "spectral", d = 3) by the series with the absolute bound ``tol`` (the heavy sources summed
        directly; refused targets by the direct sum), and on a uniform circle grid by the FFT. ``"pruned"``
        is refused (its bound is relative to the softmax normaliser).

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

    The model holds only these parameters (no state). The methods below live in
    :mod:`spherepde.evaluation` (one class each in a registry); an
    :class:`~spherepde.evaluation.AttentionEvaluator` (:meth:`evaluator`) chooses among them, owns the
    fallback chain and returns each field with a :class:`~spherepde.evaluation.FieldInfo` (methods run,
    targets refused, the largest certified bound). :meth:`mean_field` is the stateless shortcut.

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
    - ``"tree"`` (d = 2, 3): the dual tree of :mod:`spherepde.kernels.tree`. Targets (in u-space,
      u = beta B^T x) and sources each in a binary tree of balls; for a target node (centre u0, radius
      r_T) and a source node (centre c, radius r_S), exp(<u, y>) = exp(<u, c>) exp(<u0, y - c>)
      exp(<u - u0, y - c>), and only the last factor, with |<u - u0, y - c>| <= rho = r_T r_S, couples
      targets to sources: its truncated Chebyshev series of degree p on [-rho, rho], written in
      monomials, turns the pair into source moments formed once and evaluated at each target, with the
      series' tail 2 e^(rho^2/4) (rho/2)^(p+1) / (p+1)! (times e^rho, plus rounding) as a relative bound
      of the pair's (positive) sums (2^p / 2 below the Taylor polynomial's Lagrange remainder, so the
      degrees are lower). Pairs whose exponent bound lies below eta_p / W of
      the targets' lower bound of D are pruned; leaf pairs that no expansion serves are summed
      directly. |m_hat - m| <= (1 + sqrt 3)(eta + 64 eps), eta the sums' relative error (expansions,
      pruning, and the exponents' rounding ~3 kappa eps). Since the coupling is second order in the two
      radii, a whole cluster of tokens meets another through one expansion: O((N + M) P) where the
      pruned sums are O(N M). Refuses every target where tol leaves no budget after the rounding.
    - ``"auto"``: direct for N M <= 4e6. Where the fast spectral path is allowed (tol >= ~6e-11):
      the cheapest of direct, pruned and spectral by a CPU-time model. Otherwise, where the pruned sums
      would skip at least half the sources (their share counted at 16 sample targets, with the weights:
      the sources within log(N / 64 / tol) + 3 of the largest term), the cheaper by the CPU-time models
      of them (or the tree, below) and the in-house series (d = 3, its cost weighted by the share of the
      targets its bound passed the last time), and direct instead of pruned where making the pruned sums'
      source blocks (kept per source set) costs more than pruning saves (a one-off evaluation at few
      targets); else spectral when d = 3 and L <= 64; else direct. Where the guaranteed sums (direct or
      pruned, chosen or taking refused targets) would cost more than 0.05 s and 3x the tree's set-up, the
      tree's traversal is planned (counted, not run) and the tree is taken where its modelled cost is
      below theirs.
    """

    B: np.ndarray
    V: np.ndarray
    beta: float
    tol: float = 1e-12
    method: str = "auto"
    normalization: str = "softmax"
    dim: int = field(init=False)

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
        if self.method not in selectable_methods():
            raise ValueError(f"method must be one of {selectable_methods()}, got {self.method!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        object.__setattr__(self, "B", B)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "beta", b)
        object.__setattr__(self, "tol", tol)
        object.__setattr__(self, "dim", B.shape[0])

    # ------------------------------------------------------------------ evaluation
    def evaluator(self) -> AttentionEvaluator:
        """A new :class:`~spherepde.evaluation.AttentionEvaluator` of this model: it chooses the method,
        owns the fallback chain, caches and the memory of its choices, and returns every field with its
        :class:`~spherepde.evaluation.FieldInfo`. Keep one for a sequence of evaluations (a run)."""
        return AttentionEvaluator(self)

    def mean_field(self, targets, sources, weights, method=None, *, evaluator=None, return_info=False):
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
        evaluator : AttentionEvaluator, optional
            The evaluator to use (its caches and memory); default a fresh one (:meth:`evaluator`), so that
            the call depends on nothing but its arguments.
        return_info : bool
            Also return the :class:`~spherepde.evaluation.FieldInfo` (methods run, bound, ...).

        Returns
        -------
        (M, d) ndarray [, FieldInfo]
            m_beta(x_i), with |m_hat - m| <= tol at every target (rounding for "direct").
        """
        ev = self.evaluator() if evaluator is None else evaluator
        m, info = ev.mean_field(targets, sources, weights, method)
        return (m, info) if return_info else m

    def spectral_degree(self, kappa_max: float) -> tuple[int, int]:
        """Degree L of the Funk-Hecke series for concentrations up to ``kappa_max`` at this model's
        ``tol``, and the number of extra backward-recurrence terms
        (:func:`spherepde.evaluation.methods.spectral_degree`)."""
        return _methods.spectral_degree(self.tol, kappa_max)

    @property
    def value_matrix(self) -> np.ndarray:
        """V: the field is of the attention form P_x(V m) (:attr:`Model.value_matrix`)."""
        return self.V

    @property
    def usa_shift(self) -> float:
        """s_B = sigma_max(B), the shift of the USA exponents (so that beta (<x, B y> - s_B) <= 0)."""
        return float(np.linalg.norm(self.B, 2))

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
