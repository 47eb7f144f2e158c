"""Token (particle) simulations of the transformer dynamics on S^(d-1), for the same models as the PDE.

Functions
---------
simulate_particles(model, x0, t_end, dt, save_at=None, method="euler", hardmax=False, weights=None)
    Integrate n tokens; returns a :class:`ParticleResult`.
particle_velocity(model, x, t=0.0, weights=None, hardmax=False)
    The velocity of every token in a configuration (the right-hand side the schemes integrate).

Schemes (registry :data:`SCHEMES`)
----------------------------------
``"euler"``
    Algorithm 1 of the paper: explicit Euler step, then x <- x / |x|.
``"rk4"``
    Classical Runge-Kutta 4 on the field g(x) = v(x / |x|) (stages normalised), then x <- x / |x|.
    Fourth order: g is a smooth extension of v off the sphere whose flow keeps |x| constant, and the
    final renormalisation moves the point by O(dt^5).

Interaction rules (``ParticleResult.rule``), chosen from the model
------------------------------------------------------------------
``"softmax"``
    models with attributes ``B, V, beta`` (``Attention``), finite beta:
    dx_i/dt = P_{x_i}( V sum_j w_j e^{beta <x_i, B x_j>} x_j / sum_j w_j e^{beta <x_i, B x_j>} ).
    Up to :data:`FAST_PAIRS` token pairs (n <= 2000) by the direct O(n^2) kernel; beyond, by the model's
    certified evaluator (:mod:`spherepde.evaluation`, ``method="auto"``: fast spherical transforms, pruned or
    direct sums, whichever its cost model picks), within the model's ``tol`` at every token (the fast
    transforms need ``tol >= ~6e-11``: ``Attention(B, V, beta, tol=1e-10)``). ``validation/bench_particles.py``
    measures it at n = 1e5.
``"independent"``
    ``ZeroTemperature``: Algorithm 2, each token moves alone with v_inf(x) = P_x(V B^T x) / |B^T x|
    (the beta = infinity limit *of the mean field*).
``"hardmax"``
    ``hardmax=True`` with a model having ``B`` and ``V`` (``Attention``, whose beta is then ignored, or
    ``ZeroTemperature``): the softmax over particles replaced by the hardmax, x_i attends only to
    argmax_j <x_i, B x_j>. This is Algorithm 1 with beta = infinity set formally; for finitely many
    tokens it is NOT Algorithm 2 and NOT the zero-temperature PDE (paper, Appendix C.1). Offered for
    comparison only.
``"prescribed"``
    ``Prescribed`` (and any local model): v = model.field(x, t).
``"sum"``
    A model built from terms (``Sum``, ``MultiHead``, ``Layers``; :mod:`spherepde.models.terms`): its
    local fields plus sum_h w_h v_h over its attention heads, each head by the softmax rule; with layers,
    every step ends on a layer start and uses the layer in force at its start.

Conventions: score <x, B y>, value V y, A = V B^T (as everywhere in spherepde).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from ._checks import as_points, finite_float, real_array
from .kernels.particles import hardmax_mean, launch, softmax_mean
from .models import terms as _terms
from .models.base import Model, tangent_project
from .models.zero_temperature import ZeroTemperature
from .steppers import StepController

__all__ = ["ParticleResult", "simulate_particles", "particle_velocity", "SCHEMES", "NORM_TOL"]

log = logging.getLogger(__name__)

#: Largest accepted deviation | |x0_i| - 1 | of the initial tokens (they are then renormalised exactly).
NORM_TOL = 1e-6
#: Above this many token pairs (n^2) an attention head's softmax over the tokens is evaluated by the
#: model's certified evaluator (:mod:`spherepde.evaluation`: fast transforms, pruned sums, with the model's
#: ``tol`` at every token; the largest bound is ``ParticleResult.field_bound``); at or below it by the direct
#: kernel (the same bits as before: the evaluator's "auto" would choose direct sums there too).
FAST_PAIRS = 4e6


class _FieldStats:
    """The largest certified bound and the methods of the evaluator calls of one particle run."""

    def __init__(self):
        self.bound = 0.0
        self.methods: set = set()

    def add(self, info):
        self.bound = max(self.bound, info.bound)
        self.methods.update(info.methods)


@dataclass(frozen=True, eq=False)
class ParticleResult:
    """Token trajectories saved at chosen times.

    Attributes
    ----------
    times : (n_saved,) ndarray
        Saved times, increasing, within [0, t_end].
    positions : (n_saved, n, d) ndarray
        Token positions (unit vectors) at ``times``.
    weights : (n,) ndarray
        Token masses (sum 1), constant in time: the empirical measure is sum_i w_i delta_{x_i(t)}.
    model : object
        The model that was integrated.
    method : str
        Time scheme (``"euler"`` = Algorithm 1, ``"rk4"``).
    rule : str
        Interaction rule: ``"softmax"``, ``"hardmax"``, ``"independent"`` (Algorithm 2), ``"prescribed"`` or
        ``"sum"`` (a model built from terms).
    dt : float
        Nominal time step (steps are shortened to land exactly on saved times and t_end).
    n_steps : int
        Number of steps taken (accepted).
    diagnostics : dict of (n_steps,) arrays
        ``time`` (end of each step), ``dt``, ``error`` (largest per-token estimated local error),
        ``rejected`` (attempts rejected before the step; always 0 at fixed steps).
    rtol : float or None
        The error-control tolerance (None: fixed steps).
    field_bound : float
        The largest certified error bound on the attention means of any evaluation (<= the heads' ``tol``);
        0.0 where every evaluation was a direct sum (n^2 <= :data:`FAST_PAIRS`: exact to rounding).
    field_methods : tuple of str
        The evaluation methods used above :data:`FAST_PAIRS` (:mod:`spherepde.evaluation`), sorted.
    """

    times: np.ndarray
    positions: np.ndarray
    weights: np.ndarray
    model: object
    method: str
    rule: str
    dt: float
    n_steps: int
    diagnostics: dict = field(default_factory=dict)
    rtol: float | None = None
    field_bound: float = 0.0
    field_methods: tuple = ()

    @property
    def error_estimate(self) -> float:
        """Sum of the per-step local error estimates (largest over tokens): the global position error
        to first order, without the amplification by the flow."""
        e = self.diagnostics.get("error")
        return float(np.sum(e)) if e is not None else float("nan")

    @property
    def n(self) -> int:
        return self.positions.shape[1]

    @property
    def dim(self) -> int:
        return self.positions.shape[2]

    def measure(self, k: int = -1):
        """``(points, weights)`` of the empirical measure at saved index ``k`` (default: last)."""
        return self.positions[k], self.weights


# ----------------------------------------------------------------------------------------------------
# velocity


def _composite(model) -> bool:
    return isinstance(model, (_terms.Sum, _terms.MultiHead, _terms.Layers, _terms.Noise))


def _rule(model, hardmax: bool) -> str:
    if _composite(model):
        if hardmax:
            raise ValueError(f"hardmax=True needs a single Attention or ZeroTemperature model, got "
                             f"{_terms.describe(model)}")
        return "sum"
    if hardmax:
        if not (hasattr(model, "B") and hasattr(model, "V")):
            raise ValueError(
                "hardmax=True needs a model with attention matrices B and V (Attention or ZeroTemperature), "
                f"got {type(model).__name__}"
            )
        return "hardmax"
    if isinstance(model, ZeroTemperature):
        return "independent"
    if all(hasattr(model, a) for a in ("B", "V", "beta")):
        beta = float(model.beta)
        if not np.isfinite(beta) or beta < 0:
            raise ValueError(
                f"model.beta must be finite and >= 0 for the softmax over particles, got {beta}; "
                "use ZeroTemperature(B, V) for beta = infinity (Algorithm 2) or hardmax=True"
            )
        return "softmax"
    if isinstance(model, Model) and getattr(model, "local", False):
        return "prescribed"
    raise TypeError(
        f"model must be ZeroTemperature, an attention model with attributes B, V, beta, or a local Model "
        f"with field(x, t) (e.g. Prescribed); got {type(model).__name__}"
    )


def _sum_velocity_fn(model, weights, stats=None):
    """x, t -> v of a resolved composite model: its local fields plus sum_h w_h v_h over its heads (each
    head by its own rule: the softmax over the tokens)."""
    local, heads = _terms.decompose(model)
    fns = [(w, _velocity_fn(h, _rule(h, False), weights, stats)) for w, h in heads]

    def v_sum(x, t):
        out = np.zeros_like(x)
        for m in local:
            out += np.asarray(m.field(x, t), float)
        for w, fn in fns:
            out += w * fn(x, t)
        return out

    return v_sum


class _LayeredVelocity:
    """The right-hand side of a model with layer-wise weights: ``at(t)`` is the one of the layer in force on
    the step that starts at t (a step never crosses a boundary, so its stages all use that layer)."""

    def __init__(self, model, weights, stats=None):
        self.bounds = _terms.boundaries(model)
        starts = (0.0,) + self.bounds
        self._fns = [_sum_velocity_fn(_terms.resolve(model, t), weights, stats) for t in starts]

    def index(self, t: float) -> int:
        return _terms.interval_index(self.bounds, t)

    def at(self, t: float):
        return self._fns[self.index(t)]

    def __call__(self, x, t):
        return self.at(t)(x, t)


def _velocity_fn(model, rule: str, weights: np.ndarray, stats: _FieldStats | None = None
                 ) -> Callable[[np.ndarray, float], np.ndarray]:
    """The right-hand side x (n, d), t -> v (n, d) for one rule (weights fixed for the run); ``stats``
    collects the bounds of the certified evaluations."""
    if rule == "sum":
        return _LayeredVelocity(model, weights, stats) if _terms.boundaries(model) else \
            _sum_velocity_fn(_terms.resolve(model, 0.0), weights, stats)
    if rule == "independent":
        return lambda x, t: model.velocity(x)
    if rule == "prescribed":
        return lambda x, t: model.field(x, t)

    B = np.ascontiguousarray(model.B, dtype=float)
    V = np.asarray(model.V, dtype=float)
    with np.errstate(divide="ignore"):
        logw = np.log(weights)

    if rule == "softmax":
        beta = float(model.beta)
        usa = getattr(model, "normalization", "softmax") == "usa"
        shift = beta * model.usa_shift if usa else 0.0
        # many tokens: the model's evaluator (one per head and run: its caches and memory), certified to tol
        ev = model.evaluator() if (not usa and callable(getattr(model, "evaluator", None))) else None

        def v_soft(x, t):
            x = np.ascontiguousarray(x)
            if ev is not None and float(x.shape[0]) ** 2 > FAST_PAIRS:
                mean, info = ev.mean_field(x, x, weights)
                if stats is not None:
                    stats.add(info)
                return tangent_project(x, mean @ V.T)
            mean = np.empty_like(x)
            lse = np.empty(x.shape[0])
            launch(softmax_mean, x.shape[0] ** 2, x, np.ascontiguousarray(x.T), logw, B, beta, mean, lse)
            if usa:  # the unnormalised mean: the softmax mean times exp(lse - beta s_B) (Attention's docs)
                mean *= np.exp(lse - shift)[:, None]
            return tangent_project(x, mean @ V.T)

        return v_soft

    def v_hard(x, t):
        x = np.ascontiguousarray(x)
        mean = np.empty_like(x)
        launch(hardmax_mean, x.shape[0] ** 2, x, np.ascontiguousarray(x.T), logw, B, mean)
        return tangent_project(x, mean @ V.T)

    return v_hard


def _simulate_noisy(model, v, x, w, t_end, dt, save_at, seed, rule, stats) -> ParticleResult:
    """Projected Euler-Maruyama (see :func:`simulate_particles`'s ``seed``), fixed steps, layers landed on."""
    rng = np.random.default_rng(seed)
    bounds = _terms.boundaries(model)
    # sigma of each layer interval, resolved once (not at every step)
    sigmas = [float(np.sqrt(2.0 * _terms.noise_diffusivity(_terms.resolve(model, s)))) for s in (0.0,) + bounds]
    knots, save_idx = _time_knots(t_end, dt, save_at, bounds)
    d = x.shape[1]
    out = np.empty((save_idx.size, x.shape[0], d))
    save_at_knot = {int(k): i for i, k in enumerate(save_idx)}
    if 0 in save_at_knot:
        out[save_at_knot[0]] = x
    log.info("simulate_particles: n=%d d=%d rule=%s Euler-Maruyama steps=%d", x.shape[0], d, rule, knots.size - 1)
    for k in range(knots.size - 1):
        t, h = float(knots[k]), float(knots[k + 1] - knots[k])
        vk = v.at(t) if isinstance(v, _LayeredVelocity) else v
        sigma = sigmas[_terms.interval_index(bounds, t)]
        y = x + h * vk(x, t)
        if sigma > 0:
            xi = rng.standard_normal(x.shape)
            y += sigma * np.sqrt(h) * tangent_project(x, xi)
        x = _normalise(y)
        if k + 1 in save_at_knot:
            out[save_at_knot[k + 1]] = x
    if not np.all(np.isfinite(out)):
        raise FloatingPointError("particle positions became non-finite; reduce dt or check the model")
    steps = np.diff(knots)
    diagnostics = {"time": knots[1:].astype(float), "dt": steps.astype(float), "error": np.zeros(steps.size),
                   "rejected": np.zeros(steps.size)}
    return ParticleResult(times=knots[save_idx].copy(), positions=out, weights=w, model=model,
                          method="euler-maruyama", rule=rule, dt=float(dt), n_steps=int(steps.size),
                          diagnostics=diagnostics, rtol=None, field_bound=stats.bound,
                          field_methods=tuple(sorted(stats.methods)))


def particle_velocity(model, x, t: float = 0.0, weights=None, hardmax: bool = False) -> np.ndarray:
    """Velocity of every token of the configuration ``x``.

    Parameters
    ----------
    model : ZeroTemperature, attention model (B, V, beta) or Prescribed
    x : (n, d) array_like
        Token positions (unit rows).
    t : float
        Time (used by time-dependent prescribed fields).
    weights : (n,) array_like, optional
        Token masses (default uniform 1/n).
    hardmax : bool
        Hardmax over particles instead of the softmax (see the module docstring).

    Returns
    -------
    v : (n, d) ndarray
        Tangent velocities; see the module docstring for the formula of each rule.
    """
    d = _model_dim(model)
    x = as_points(x, d, "x")
    w = _check_weights(weights, x.shape[0])
    rule = _rule(model, hardmax)
    return _velocity_fn(model, rule, w)(x, float(t))


# ----------------------------------------------------------------------------------------------------
# schemes


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1)[:, None]


def _euler_step(v, x, t, h, k1=None):
    """Algorithm 1: x <- N(x + h v(x, t)), N(y) = y / |y|. Returns (x_new, k1, y_new) with y_new the
    unnormalised update (the error estimate compares it with the embedded solution)."""
    k1 = v(x, t) if k1 is None else k1
    y = x + h * k1
    return _normalise(y), (k1,), y


def _euler_error(v, x_new, t_new, h, ks, y):
    """Heun minus Euler, h/2 (v(x_new) - v(x)) per token: the local error of the Euler step to leading
    order. Returns (error per token, v(x_new)): the latter is the next step's first stage (FSAL)."""
    k_new = v(x_new, t_new)
    return 0.5 * h * np.linalg.norm(k_new - ks[0], axis=1), k_new


def _rk4_step(v, x, t, h, k1=None):
    """Classical RK4 on g(y) = v(y/|y|): stages normalised, result renormalised."""
    k1 = v(x, t) if k1 is None else k1
    k2 = v(_normalise(x + 0.5 * h * k1), t + 0.5 * h)
    k3 = v(_normalise(x + 0.5 * h * k2), t + 0.5 * h)
    k4 = v(_normalise(x + h * k3), t + h)
    y = x + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    return _normalise(y), (k1, k2, k3, k4), y


def _rk4_error(v, x_new, t_new, h, ks, y):
    """RK4 against its embedded third-order solution with the FSAL stage k5 = v(x_new):
    b_hat = (1/6, 1/3, 1/3, 0, 1/6) satisfies the four order-3 conditions, so the difference
    h/6 |k4 - k5| is O(h^4) (an upper estimate of RK4's O(h^5) local error)."""
    k5 = v(x_new, t_new)
    return (h / 6.0) * np.linalg.norm(ks[3] - k5, axis=1), k5


class ParticleScheme(NamedTuple):
    """A particle time scheme: ``step(v, x, t, h, k1) -> (x_new, stages, y)``, its error estimate
    ``error(v, x_new, t_new, h, stages, y) -> (per-token error, v(x_new))``, its order, and the order q of
    the estimate's ratio to the step's displacement (error / |dx| = O(h^q))."""

    step: Callable
    error: Callable
    order: int
    error_order: int


#: Time schemes by name.
SCHEMES: dict[str, ParticleScheme] = {
    "euler": ParticleScheme(_euler_step, _euler_error, 1, 1),
    "rk4": ParticleScheme(_rk4_step, _rk4_error, 4, 3),
}


# ----------------------------------------------------------------------------------------------------
# validation


def _model_dim(model) -> int:
    d = getattr(model, "dim", None)
    if d is None and hasattr(model, "B"):
        d = np.asarray(model.B).shape[0]
    if d is None:
        raise TypeError(f"model must have a dimension attribute dim, got {type(model).__name__}")
    return int(d)


def _check_weights(weights, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    w = real_array(weights, "weights")
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},) (one mass per token), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    s = w.sum()
    if not s > 0:
        raise ValueError("weights must have a positive sum")
    return w / s


def _check_x0(x0, d: int) -> np.ndarray:
    x = as_points(x0, d, "x0")
    if x.shape[0] < 1:
        raise ValueError("x0 must hold at least one token, got shape (0, d)")
    dev = np.abs(np.linalg.norm(x, axis=1) - 1.0)
    if dev.max() > NORM_TOL:
        i = int(np.argmax(dev))
        raise ValueError(
            f"x0 rows must be unit vectors (| |x| - 1 | <= {NORM_TOL:g}); row {i} has norm "
            f"{np.linalg.norm(x[i]):.6g}. Normalise with x0 / np.linalg.norm(x0, axis=1, keepdims=True)"
        )
    return _normalise(x)


#: Most fixed steps a particle run may ask for (t_end / dt): beyond, a clear error instead of an
#: array of knots that does not fit in memory (t_end = 1e308 or dt = 1e-320).
MAX_FIXED_STEPS = 1e8


def _time_knots(t_end: float, dt: float, save_at, extra=()):
    """Step end points: the uniform grid k dt, the save times, t_end and the ``extra`` times in (0, t_end)
    (layer boundaries), merged within 1e-9 dt."""
    tol_merge = 1e-9 * (min(dt, t_end) if t_end > 0 else dt)
    if isinstance(save_at, str):
        if save_at != "all":
            raise ValueError(f"save_at must be None, 'all' or an increasing array of times, got {save_at!r}")
        save = None
    elif save_at is None:
        save = np.array([0.0, t_end]) if t_end > 0 else np.array([0.0])
    else:
        save = np.atleast_1d(real_array(save_at, "save_at"))
        if save.ndim != 1 or save.size == 0:
            raise ValueError("save_at must be a non-empty 1-D array of times")
        if not np.all(np.isfinite(save)):
            raise ValueError("save_at must be finite")
        if np.any(np.diff(save) <= 0):
            raise ValueError("save_at must be strictly increasing")
        slack = 1e-12 * max(1.0, t_end)
        if save[0] < -slack or save[-1] > t_end + slack:
            raise ValueError(f"save_at must lie within [0, t_end] = [0, {t_end:g}], got [{save[0]:g}, {save[-1]:g}]")
        save = np.clip(save, 0.0, t_end)
    n_uniform = max(1, int(np.ceil(t_end / dt - 1e-9))) if t_end > 0 else 0  # dt > t_end: one step
    grid = np.minimum(np.arange(n_uniform + 1) * dt, t_end)
    inner = [b for b in extra if 0.0 < b < t_end]
    pts = np.concatenate([grid, [t_end], save if save is not None else [], inner])
    pts.sort()
    knots = [pts[0]]
    for p in pts[1:]:
        if p - knots[-1] > tol_merge:
            knots.append(p)
    knots = np.array(knots)
    if save is None:
        save_idx = np.arange(knots.size)
    else:
        save_idx = np.array([int(np.argmin(np.abs(knots - s))) for s in save])
    return knots, save_idx


# ----------------------------------------------------------------------------------------------------
# driver


def simulate_particles(
    model,
    x0,
    t_end: float,
    dt: float,
    save_at=None,
    method: str = "euler",
    hardmax: bool = False,
    weights=None,
    rtol: float | None = None,
    atol: float = 1e-10,
    seed=None,
) -> ParticleResult:
    r"""Integrate n tokens on S^(d-1) under ``model``.

    Parameters
    ----------
    model : ZeroTemperature, attention model (attributes B, V, beta) or Prescribed
        Chooses the interaction rule (module docstring): ``ZeroTemperature`` moves tokens independently
        with v_inf (Algorithm 2); an attention model uses the softmax over particles; ``Prescribed``
        uses ``model.field(x, t)``.
    x0 : (n, d) array_like
        Initial tokens, unit rows (| |x| - 1 | <= 1e-6; renormalised exactly), d = ``model.dim``.
    t_end : float
        Final time, >= 0.
    dt : float
        Time step, > 0 (the paper uses 0.01). Steps are shortened where needed to hit saved times and
        ``t_end`` exactly; with save times on the grid k dt the run is exactly Algorithm 1.
    save_at : None, "all" or (n_saved,) array_like
        Times at which positions are stored: None gives [0, t_end]; "all" every step; an array must be
        strictly increasing within [0, t_end]. Memory: n_saved * n * d * 8 bytes.
    method : {"euler", "rk4"}
        ``"euler"`` is Algorithm 1 (explicit Euler + renormalisation); ``"rk4"`` is fourth order.
    hardmax : bool, default False
        Replace the softmax over particles by the hardmax (a different limit, see the module docstring).
        Needs a model with B and V; a ``ZeroTemperature`` model then runs "Algorithm 1 at beta = inf",
        not Algorithm 2.
    weights : (n,) array_like, optional
        Token masses (non-negative, normalised to sum 1); default uniform 1/n.
    rtol : float in (0, 1), optional
        None (default): fixed steps ``dt`` (with ``method="euler"`` exactly Algorithm 1). A number: the
        step is chosen by error control, ``dt`` is then the first and the largest step. A step is
        accepted when every token's estimated local error is <= ``atol + rtol |x_new - x|`` (error per
        unit step, as the PDE solver's; see :mod:`spherepde.steppers`).
    atol : float >= 0, default 1e-10
        Absolute floor of the per-token error per step (positions on the unit sphere).
    seed : int or numpy Generator, optional
        The random stream of a model with a ``Noise`` term: Brownian increments by the projected
        Euler-Maruyama scheme x <- (x + dt v(x) + sigma sqrt(dt) P_x xi) / |...|, xi ~ N(0, I_d) (weak
        order 1; the renormalisation supplies the drift -(d - 1) sigma^2 / 2 x of Brownian motion on the
        sphere). Such a model needs ``method="euler"`` and fixed steps (``rtol=None``); the same seed gives
        the same run.

    Returns
    -------
    ParticleResult
        ``times`` (n_saved,), ``positions`` (n_saved, n, d), ``weights``, ``model``, ``method``, ``rule``,
        ``diagnostics`` (per step: ``time`` at its end, ``dt``, ``error`` the largest per-token estimated
        local error, ``rejected`` attempts) and ``error_estimate`` (their sum: the global error estimate
        to first order, without the flow's amplification).

    Notes
    -----
    Softmax rule, with s_ij = beta <x_i, B x_j>:

    .. math:: \dot x_i = P_{x_i}\Big(V \frac{\sum_j w_j e^{s_{ij}} x_j}{\sum_j w_j e^{s_{ij}}}\Big),
              \qquad P_x(y) = y - \langle x, y\rangle x,

    evaluated with a row-max shift (stable at any beta) in O(n^2 d) per evaluation without an n x n
    array. Euler step: x <- (x + dt v) / |x + dt v|.

    Error estimates (every method, also at fixed steps, at the cost of one extra velocity evaluation per
    run: the estimate's last stage v(x_new) is the next step's first): Euler against Heun,
    h/2 |v(x_new) - v(x)|; RK4 against its embedded third-order solution with that FSAL stage,
    h/6 |k4 - v(x_new)|. Both are upper estimates of the local error of the method (local extrapolation).

    References
    ----------
    A. Alcalde, L. Bungert, K. Riedl, T. Roith, "Quantifying concentration phenomena of mean-field
    transformers in the low-temperature regime", arXiv:2605.10931, Appendix C.1 (Algorithms 1, 2).
    """
    if method not in SCHEMES:
        raise ValueError(f"method must be one of {sorted(SCHEMES)}, got {method!r}")
    d = _model_dim(model)
    x = _check_x0(x0, d)
    t_end = finite_float(t_end, "t_end", low=0.0)
    dt = finite_float(dt, "dt", low=0.0, low_open=True)
    if rtol is not None:
        rtol = finite_float(rtol, "rtol", low=0.0, high=1.0, low_open=True, high_open=True)
    atol = finite_float(atol, "atol", low=0.0)
    w = _check_weights(weights, x.shape[0])
    rule = _rule(model, bool(hardmax))
    stats = _FieldStats()
    v = _velocity_fn(model, rule, w, stats)
    if rule == "sum" and _terms.has_noise(model):
        if method != "euler":
            raise ValueError(f"a model with Noise needs method='euler' (Euler-Maruyama), got method={method!r}")
        if rtol is not None:
            raise ValueError("a model with Noise needs fixed steps (rtol=None): the error estimate of the "
                             "deterministic schemes does not measure the noise")
        return _simulate_noisy(model, v, x, w, t_end, dt, save_at, seed, rule, stats)
    step, error, _, q = SCHEMES[method]
    controller = StepController(1.0 / q)  # the PDE solver's step-size rule
    if rtol is None:
        if t_end / dt > MAX_FIXED_STEPS:
            raise ValueError(f"t_end / dt = {t_end / dt:.3g} fixed steps (t_end = {t_end:g}, dt = {dt:g}) exceed "
                             f"{MAX_FIXED_STEPS:.0e}: raise dt, shorten t_end, or use adaptive steps (rtol=...)")
        knots, save_idx = _time_knots(t_end, dt, save_at, getattr(v, "bounds", ()))
    else:  # adaptive: the knots are only the save times (and t_end), the steps come from the controller
        if isinstance(save_at, str) and save_at == "all":
            raise ValueError('save_at="all" needs fixed steps (rtol=None): adaptive steps are not known up front')
        knots, save_idx = _time_knots(t_end, max(t_end, 1.0), save_at)
    save_times = knots[save_idx]
    if rtol is not None:
        knots = None

    log.info("simulate_particles: n=%d d=%d rule=%s method=%s %s", x.shape[0], d, rule, method,
             f"steps={knots.size - 1}" if knots is not None else f"adaptive rtol={rtol:g}")
    out = np.empty((save_times.size, x.shape[0], d))
    diag = {"time": [], "dt": [], "error": [], "rejected": []}
    t, k1, n_out = 0.0, None, 0
    while n_out < save_times.size and save_times[n_out] <= t:
        out[n_out] = x
        n_out += 1
    h_prop, kk = dt, 0  # the controller's proposal; the index of the fixed-step knot reached
    layered = isinstance(v, _LayeredVelocity)
    v_all, layer = v, None
    while t < t_end:
        if layered:  # the step's layer; a new layer invalidates the last step's final stage (FSAL)
            if v_all.index(t) != layer:
                layer, k1 = v_all.index(t), None
            v = v_all.at(t)
        if knots is None:  # adaptive: up to the next save time (or t_end), and the next layer boundary
            target = save_times[n_out] if n_out < save_times.size else t_end
            if layered:
                target = min(target, _terms.next_boundary(model, t, v_all.bounds))
            h_free = min(h_prop, dt)
            h = min(h_free, target - t)
        else:
            target = knots[kk + 1]
            h = h_free = target - t
        rejected = 0
        while True:
            x_new, ks, y = step(v, x, t, h, k1)
            t_new = target if h == target - t else t + h
            err_tok, k_next = error(v, x_new, t_new, h, ks, y)
            if rtol is None:
                break
            ratio = float(np.max(err_tok / (atol + rtol * np.linalg.norm(x_new - x, axis=1))))
            if not np.isfinite(ratio):
                raise FloatingPointError(f"non-finite particle error estimate at t = {t}; check the model")
            if ratio <= 1.0:
                h_prop = h * controller.factor(ratio, after_reject=rejected > 0)
                if h < h_free and rejected == 0:  # shortened to land on a save time: keep the free proposal
                    h_prop = max(h_prop, h_free)
                break
            rejected += 1
            if rejected > 60 or h <= 1e-14 * max(1.0, t):
                raise RuntimeError(f"particle step size underflow at t = {t}: the error estimate cannot meet "
                                   f"rtol = {rtol:g}, atol = {atol:g}")
            h *= controller.factor(ratio, after_reject=True)
            k1 = ks[0]
        x, t, k1 = x_new, t_new, k_next
        kk += 1
        for key, val in zip(("time", "dt", "error", "rejected"), (t, h, float(err_tok.max()), rejected)):
            diag[key].append(val)
        while n_out < save_times.size and abs(save_times[n_out] - t) <= 1e-12 * max(1.0, t_end):
            out[n_out] = x
            n_out += 1
    if not np.all(np.isfinite(out)):
        raise FloatingPointError("particle positions became non-finite; reduce dt or check the model")
    diagnostics = {k: np.array(val, dtype=float) for k, val in diag.items()}
    return ParticleResult(
        times=save_times.copy(), positions=out, weights=w, model=model, method=method, rule=rule,
        dt=dt, n_steps=len(diag["dt"]), diagnostics=diagnostics, rtol=rtol, field_bound=stats.bound,
        field_methods=tuple(sorted(stats.methods)),
    )
