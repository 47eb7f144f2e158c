r"""Time stepping of the continuity equation d_t f + div_S(f v) = 0 on a grid.

``solve(grid, model, f0, t_end, save_at=...)`` is the entry point; :class:`Solver` is the stepper behind
it (resumable: its state can be saved and restored). Options live in one validated :class:`Options`.

Notes
-----
Semi-discretisation (finite volumes, cell averages f_i):

.. math:: \frac{d f_i}{dt} = -\frac{1}{|C_i|} \sum_{e \in \partial C_i} \pm F_e, \qquad
          F_e = \sum_g a_g\, f^{\rm up}(X_g), \quad a_g = v(X_g) \cdot W_g,

with the upwind value of the (limited) linear reconstruction at each edge Gauss point
(:mod:`spherepde.kernels.fv`). Time: strong-stability-preserving Runge-Kutta in Shu-Osher form, each
stage a convex combination of forward-Euler stages, so positivity and exact mass conservation carry
over (:mod:`spherepde.steppers`). Time step: at most the CFL step CFL / max_i (sum of outflow a_g of cell
i / |C_i|) (stability), chosen within it by the embedded error estimate of the stepper (accuracy: error
per unit step, ``rtol`` / ``atol``); rejected attempts are retried smaller.
"""
from __future__ import annotations

import logging
import sys
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ._checks import finite_float, positive_int, real_array
from .kernels import fv
from .grids.base import quadratic_pair_arrays, quadratic_width, source_weights
from .models import terms as _terms
from .models.terms import attention_kernels, attention_scale
from .steppers import STEPPERS, SSPStepper, StepController, register_stepper

__all__ = ["Options", "Result", "Solver", "solve", "STEPPERS", "SSPStepper", "register_stepper", "SCHEMES", "LIMITERS"]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- time steppers
# The schemes and their embedded error estimates live in spherepde.steppers (re-exported here).

#: Spatial schemes: first-order upwind, linear (second order) or quadratic (third order) reconstruction, or the
#: quadratic reconstruction of log f (positive by construction; S^2).
SCHEMES = ("upwind", "linear", "quadratic", "log-quadratic")
LIMITERS = ("positivity", "maximum", "none")
FIELD_TIMES = ("auto", "exact", "interpolate")


@dataclass(frozen=True)
class Options:
    """Numerical options of :func:`solve`, validated on construction.

    Parameters
    ----------
    scheme : {"linear", "quadratic", "upwind"}, default "linear"
        "linear": least-squares linear reconstruction (second order); "quadratic": least-squares
        quadratic reconstruction on the same stencils (third order in space,
        :func:`spherepde.grids.base.quadratic_stencil`; with the default third-order stepper the scheme is
        third order in time too), with the same positivity limiter applied to the whole quadratic;
        "upwind": piecewise constant. "log-quadratic" (S^2 grids): f = f_i exp(L_i) / <exp(L_i)>_i in
        each cell, L_i the least-squares quadratic of log f on the same stencils, the cell mean f_i exactly
        (:func:`spherepde.kernels.fv.stage_update_log`). Positive by construction, so no limiter scales it:
        narrow clusters (a vMF bump is the exponential of a nearly quadratic function) keep their shape and
        position inside a cell where the limited polynomial schemes smear them by a cell (measured on
        the bump proxy: centroid errors 2-10x smaller, ``validation/adaptive_clusters``). Third order for
        smooth positive f; it costs ~45 exponentials a cell and stage: a step takes ~15 times the
        linear scheme's on a uniform grid (nside 128, steady field), 1.5-1.8 times on the adaptive
        clusters study, where the attention field dominates. On densities that are exactly 0 next to
        sharp edges (a cosine bell on a zero background) it fits log(1e-300) there and is worse than the
        quadratic scheme (docs/user_guide.md). With ``limiter="positivity"`` (the default) a cell's
        outflows are bounded by min(8 q_tot, |C_i| / dt) f_i (``fv.LOG_OUTFLOW_RATIO``; positive for any
        step); "none" drops that bound.
    limiter : {"positivity", "maximum", "none"}, default "positivity"
        "positivity": Zhang-Shu-type scaling of the reconstruction that guarantees non-negative cell
        averages for any CFL <= 1 and keeps smooth extrema second order. "maximum": the same plus a
        Barth-Jespersen local-maximum-principle bound (reconstructed values within the range of the
        cell and its neighbours), so the discrete minimum obeys the Gronwall bound of the
        minimal-density lemma even next to under-resolved clusters; smooth extrema are clipped to first
        order. "none" is for studies only (densities may go negative).
    stepper : {"auto", "ssprk43", "ssprk3", "ssprk2", "euler"}, default "auto"
        SSP Runge-Kutta scheme (:mod:`spherepde.steppers`). "auto": SSP-RK(4,3), or SSP-RK3 for a model
        with noise (see below). Third order with a second-order embedded
        estimate is the default because under error control it takes CFL-size steps where SSP-RK2, whose
        embedded Euler estimate is only first order, takes 5-8 times more (measured on the paper's run
        at nside 16: 6940 and 12980 SSP-RK2 steps against 1253 and 1564 fixed CFL steps, uniform and
        perturbed f0; see ``validation/time_accuracy``).
        Of the two third-order schemes, SSP-RK(4,3) has SSP coefficient 2: its step may be twice the CFL
        step at the same Courant number per stage, so where the CFL limit sets the step (most runs) it
        takes half SSP-RK3's steps at 4/3 the stages each, 2/3 of the work (measured: the paper's run
        at nside 16, perturbed f0, 815 steps against 1567, L1 distance to the reference 2.8e-4 against 4.4e-4; test
        case 1 at 115k cells, 980 steps against 1960, l2 within 2 %, 0.58-0.65x the wall time).
        With noise the Strang splitting error, which the embedded estimate does not see, grows as dt^2:
        there "auto" keeps SSP-RK3's shorter steps (measured: the Gibbs-state error at nside 16 is
        4.0e-4 with SSP-RK(4,3) against 3.1e-4, order 1.41 against 1.84 from nside 8, tests/test_noise.py).
    cfl : float in (0, 1], default 0.4
        Outflow Courant number of the worst cell in each forward-Euler stage: h_s dt * (total outflow
        coefficient of cell i) / |C_i| (h_s the stage's fraction of the step: 1/2 for SSP-RK(4,3), 1 for
        the others), so the step is at most ``cfl`` times the stepper's SSP coefficient over the Courant
        rate. With ``error_control`` it is the upper limit of the step (stability), not the step itself.
    error_control : bool, default True
        Choose each step from the embedded error estimate of the stepper (accuracy) within the CFL limit
        (stability); rejected steps are retried smaller. False: the step is min(CFL step, ``max_dt``)
        (fixed-step studies, step-size ladders).
    rtol : float in (0, 1), default 1e-3
        Error per unit step: the estimated local error of a step, in the mass norm on blocks of about
        2 x 2 cells (``Grid.error_blocks``), is at most ``rtol`` times the change the step makes in the
        same norm (plus ``atol``); see :mod:`spherepde.steppers`.
        The global time error is then about ``rtol`` times the total variation of the solution, and it
        does not depend on the amplitude of a perturbation. For ``field_interval`` the predicted error
        of the extrapolated field is kept below ``rtol / 2`` (relative, weighted by the density the faces
        carry: a relative error of the flux).
    atol : float >= 0, default 1e-12
        Absolute floor of the error per step, as a fraction of the mass (round-off level: changes below
        it are not resolved in time).
    max_dt : float > 0, default inf
        A plain cap on the step.
    field_interval : int or None, default None
        Nonlocal models only. None: the field is recomputed from the density at every stage (exact
        method of lines). k >= 1: recomputed at most every k steps and extrapolated linearly in time in
        between; with ``error_control`` it is recomputed earlier whenever the extrapolation error
        predicted from the last three fields exceeds ``rtol / 2`` (and at every stage until three fields
        are known), and the measured extrapolation error is recorded (``diagnostics["field_error"]``).
    field_time : {"auto", "exact", "interpolate"}, default "auto"
        Time-dependent local fields given point-wise (``Prescribed(velocity)`` with a plain NumPy
        ``velocity(x, t)``, or ``Prescribed.compiled``) only; separable fields (``Prescribed.separable``)
        are already cheap and ignore it. "auto": "interpolate" with ``error_control`` (whose steps already
        carry an error of about rtol times the change, the level the interpolation is held to), "exact"
        with fixed steps (a step-size ladder then measures the method of lines, not an interpolation error
        set by rtol). "exact": the field is evaluated at every new stage time (the method of lines; about
        100 times the cost of a steady field at nside 256 for a NumPy field, 15-17 times for a compiled
        one). "interpolate": the field's normal velocities at the face Gauss points are evaluated
        at time nodes, and the face moments the stages read (the upwind outflow integrals) are interpolated
        linearly in time in between, as offline transport models interpolate stored mass fluxes. A convex
        combination of two upwind sets, they keep the outflows nonnegative; where a Gauss point's velocity
        changes sign between two nodes they differ from the moments of the interpolated velocity by the
        kink of max(a, 0), an error of the same order as the interpolation's. The nodes are placed ahead of
        the run, because the field is a function of t alone: each new node's spacing H is chosen, and the
        node re-placed closer when it fails, so that the interpolation error predicted from the second
        divided difference of the last three nodes' velocities, max |a''| H^2 / 8 relative to their L1
        size, is at most ``rtol / 2`` (the bound
        ``field_interval`` keeps for the attention field). The first interval has its midpoint as a node
        too, so its curvature is known from the start; a node is never closer than an eighth of a step,
        and an interval that misses ``rtol / 2`` at that spacing (a field that jumps) is evaluated exactly
        at its stage times, whose step control then answers the jump. The predicted error of the
        interval in use is recorded as ``diagnostics["field_error"]``. A stage's moments then cost one pass
        over the two nodes' cell-major moments (two stage times of a step between the same nodes share it;
        the same bits as two passes), with no face moments unless ``limiter="maximum"`` reads them (the CFL
        rate and the recorded divergence, linear in the moments, come from the nodes' per-cell values).
        Measured: ``validation/bench_transport.py``.
    max_steps : int, default 10**8
        Safety stop; exceeding it raises.
    """

    scheme: str = "linear"
    limiter: str = "positivity"
    stepper: str = "auto"
    cfl: float = 0.4
    error_control: bool = True
    rtol: float = 1e-3
    atol: float = 1e-12
    max_dt: float = float("inf")
    field_interval: int | None = None
    field_time: str = "auto"
    max_steps: int = 10**8

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {LIMITERS}, got {self.limiter!r}")
        if self.scheme in ("quadratic", "log-quadratic") and self.limiter == "maximum":
            raise ValueError("limiter='maximum' (the Barth-Jespersen bound of the linear reconstruction) needs "
                             f"scheme='linear'; with scheme={self.scheme!r} use limiter 'positivity' or 'none'")
        if not isinstance(self.stepper, str) or (self.stepper != "auto" and self.stepper not in STEPPERS):
            raise ValueError(f"stepper must be 'auto' or one of {tuple(STEPPERS)}, got {self.stepper!r}")
        object.__setattr__(self, "cfl", finite_float(self.cfl, "cfl", low=0.0, high=1.0, low_open=True))
        if not isinstance(self.error_control, (bool, np.bool_)):
            raise TypeError(f"error_control must be True or False, got {self.error_control!r}")
        object.__setattr__(self, "error_control", bool(self.error_control))
        object.__setattr__(self, "rtol", finite_float(self.rtol, "rtol", low=0.0, high=1.0, low_open=True,
                                                      high_open=True))
        object.__setattr__(self, "atol", finite_float(self.atol, "atol", low=0.0))
        try:
            max_dt = float(self.max_dt)
        except (TypeError, ValueError):
            raise TypeError(f"max_dt must be a real number > 0 (or inf), got {self.max_dt!r}") from None
        if not max_dt > 0:  # NaN fails too
            raise ValueError(f"max_dt must be > 0 (or inf for no cap), got {max_dt}")
        object.__setattr__(self, "max_dt", max_dt)
        if self.field_interval is not None:
            object.__setattr__(self, "field_interval", positive_int(self.field_interval, "field_interval"))
        if self.field_time not in FIELD_TIMES:
            raise ValueError(f"field_time must be one of {FIELD_TIMES}, got {self.field_time!r}")
        object.__setattr__(self, "max_steps", positive_int(self.max_steps, "max_steps"))

    @property
    def interpolates_field(self) -> bool:
        """Whether a time-dependent point-wise field is interpolated between time nodes (``field_time``
        "interpolate", or "auto" under ``error_control``)."""
        return self.field_time == "interpolate" or (self.field_time == "auto" and self.error_control)


@dataclass(frozen=True, eq=False)
class Result:
    """What :func:`solve` returns.

    Attributes
    ----------
    times : (n_saved,) the saved times.
    density : (n_saved, N) cell averages at the saved times; on a grid that changes during the run
        (:class:`~spherepde.grids.adaptive.AdaptiveHealpixGrid`) a list whose entry i holds the cell
        averages on ``grid_at(i)``.
    diagnostics : dict of arrays over the steps (length n_steps + 1, at step starts and the end):
        ``time``, ``mass``, ``min``, ``max``, ``sup_div`` (max over cells of the discrete div v),
        ``gronwall`` (min f_0 * exp(-int_0^t sup_div ds), trapezoidal in time), ``dt`` (step sizes),
        ``error`` (the accepted step's estimated error ratio, <= 1 under error control; see
        :mod:`spherepde.steppers`), ``rejected`` (attempts rejected before the step), ``field_error``
        (``field_interval`` only: the measured relative error of the extrapolated field where it was
        recomputed, else 0), ``field_bound`` (the largest certified bound on |m_hat - m| of the attention
        evaluations the step used, :mod:`spherepde.evaluation`; 0 for local models and direct sums; NaN for
        steps of a checkpoint written before it was recorded); the per-step entries are 0 for the last entry.
    grid, model, options : what made it (``grid``: the grid of the first saved state). n_steps : int.
    wall_time : seconds. grids : the grid of each saved state (None: ``grid`` for all): a list from
        :func:`solve`, a :class:`spherepde.io.StateGrids` (built on demand) from :func:`spherepde.io.load`.
    """

    times: np.ndarray
    density: np.ndarray
    diagnostics: dict
    grid: object
    model: object
    options: Options
    n_steps: int
    wall_time: float = 0.0
    metadata: dict = field(default_factory=dict)
    grids: Sequence | None = None

    def at(self, t: float) -> np.ndarray:
        """The saved density at the saved time closest to ``t``."""
        return self.density[int(np.argmin(np.abs(self.times - t)))]

    def _state(self, i) -> int:
        """``i`` checked against the saved states (IndexError naming them)."""
        n = len(self.times)
        if not -n <= int(i) < n:
            raise IndexError(f"saved state {i} does not exist: there are {n} (0..{n - 1})")
        return int(i)

    def grid_at(self, i: int):
        """The grid of saved state ``i`` (its ``centers`` and ``areas`` go with ``density[i]``)."""
        i = self._state(i)
        return self.grid if self.grids is None else self.grids[i]

    def areas_at(self, i: int) -> np.ndarray:
        """The cell areas of saved state ``i``, ``grid_at(i).areas``: without building a grid that a loaded file
        builds on demand (:class:`spherepde.io.StateGrids`), where its cells say them."""
        i = self._state(i)
        if self.grids is not None and hasattr(self.grids, "areas_at"):
            return self.grids.areas_at(i)
        return self.grid_at(i).areas

    def to_healpix(self, i: int, nside: int) -> np.ndarray:
        """Saved state ``i`` resampled conservatively onto a uniform HEALPix RING map at ``nside``: a map for
        plots, FITS files and any healpy tool (an adaptive grid's :meth:`to_healpix`; on a HealpixGrid of
        that nside the state itself, in RING order)."""
        grid = self.grid_at(i)
        f = np.asarray(self.density[int(i)], float)
        if hasattr(grid, "to_healpix"):
            return grid.to_healpix(f, nside)
        if getattr(grid, "nside", None) == nside and type(grid).__name__ == "HealpixGrid":
            return f.copy()
        raise ValueError(f"to_healpix needs an adaptive HEALPix grid or a HealpixGrid of nside {nside}; the grid "
                         f"of state {i} is {grid!r}")


def _initial_density(grid, f0) -> np.ndarray:
    feats = getattr(f0, "features", None)
    if callable(f0) and feats and hasattr(grid, "_sub_roots"):
        # narrow features declared as f0.features = [(point, width), ...]: adaptive cell averages, so their
        # mass is right even where they are narrower than a cell (Grid._adaptive_average)
        f = real_array(grid.cell_average(f0, rtol=1e-12, features=feats), "f0(x)")
    elif callable(f0):
        f = real_array(grid.cell_average(f0), "f0(x)")
    else:
        f = real_array(f0, "f0")
    if f.shape != (grid.n_cells,):
        raise ValueError(f"f0 must be a callable f0(x) or an array of shape ({grid.n_cells},), got {f.shape}")
    if not np.all(np.isfinite(f)):
        raise ValueError("f0 contains NaN or inf")
    if np.any(f < 0):
        raise ValueError(f"f0 must be >= 0 everywhere (a density); min is {f.min():.3e}")
    mass = grid.mass(f)
    if not (mass > 0 and np.isfinite(mass)):
        raise ValueError(f"f0 must be normalisable: its mass sum f_i |C_i| is {mass}")
    return f


def _save_times(save_at, t0: float, t_end: float) -> np.ndarray:
    if save_at is None:
        s = np.array([t0, t_end]) if t_end > t0 else np.array([t0])
    else:
        s = np.atleast_1d(real_array(save_at, "save_at"))
        if s.ndim != 1 or not np.all(np.isfinite(s)):
            raise ValueError("save_at must be a 1-D list of finite times")
        if np.any(np.diff(s) <= 0):
            raise ValueError("save_at must be strictly increasing")
        if s.size and (s[0] < t0 or s[-1] > t_end):
            raise ValueError(f"save_at times must lie in [{t0}, {t_end}], got [{s[0]}, {s[-1]}]")
    return s


#: Per-step diagnostics (lists in ``Solver.diag``); the first five are recorded at every step start.
_DIAG_KEYS = ("time", "mass", "min", "max", "sup_div", "dt", "error", "rejected", "field_error", "field_bound")
_POOL = 6  # moment array pairs kept for reuse per grid (Solver._moment_arrays)
# a regrid that made at most this share of the cells has the field recomputed at those cells alone
# (Solver._move_history); above it, on the whole grid at the next step start
_PARTIAL_SHARE = 0.25


def _refs(a) -> int:
    return sys.getrefcount(a)


def _free_refs() -> int:
    """The reference count :func:`_refs` reports, inside ``for mom, side in pool``, for an array that only
    the pool's tuple holds (measured, not assumed: interpreters differ in what they count; 0 where there
    are no reference counts, which turns the pool off)."""
    if not hasattr(sys, "getrefcount"):
        return 0
    for mom, side in [(np.empty(1), np.empty(1))]:
        return _refs(mom)


_FREE_REFS = _free_refs()
_STEP_KEYS = ("dt", "error", "rejected", "field_error", "field_bound")


class Solver:
    """Steps a density on ``grid`` under ``model``; used by :func:`solve`, resumable via its state."""

    _pair_moments = True  # field_time="interpolate": sets without face moments, two stage times in one pass

    def __init__(self, grid, model, f0, options: Options | None = None, t0: float = 0.0):
        self.options = Options() if options is None else options
        if not isinstance(self.options, Options):
            raise TypeError(f"options must be a spherepde.Options, got {type(self.options).__name__}")
        if not (hasattr(grid, "dim") and hasattr(grid, "n_cells") and hasattr(grid, "areas")):
            raise TypeError(f"grid must be a spherepde grid (HealpixGrid, AdaptiveHealpixGrid, TensorGrid), got {type(grid).__name__}")
        if not hasattr(model, "field"):
            raise TypeError(f"model must be a spherepde model (Attention, ZeroTemperature, Prescribed), got "
                            f"{type(model).__name__}")
        if getattr(model, "dim", None) != grid.dim:
            raise ValueError(f"model.dim ({getattr(model, 'dim', None)}) must equal grid.dim ({grid.dim})")
        if self.options.scheme == "log-quadratic" and (grid.dim != 3 or getattr(grid, "cell_weights", None) is None):
            raise ValueError(f"scheme='log-quadratic' needs an S^2 grid with a fixed cell quadrature (cell_points, "
                             f"cell_weights: HealpixGrid, AdaptiveHealpixGrid), got {type(grid).__name__} of dim "
                             f"{grid.dim}; use scheme 'linear' or 'quadratic' there")
        self.model = model
        self._bounds = _terms.boundaries(model)  # layer starts: every step ends on them
        self._active_key = None  # the layer interval whose resolved model is self._active
        if hasattr(model, "set_state"):  # a clean history: a model reused from another run gives the same bits
            model.set_state({})
        self.field_info = None  # FieldInfo of the last attention evaluation (spherepde.evaluation)
        self._step_bound = 0.0  # the largest certified bound of the evaluations since the last step
        self.t = finite_float(t0, "t0")
        if callable(f0) and hasattr(grid, "initial"):  # a grid that adapts refines on f0 first (Grid.initial)
            active = _terms.resolve(model, self.t)
            grid = grid.initial(f0, attention_scale(active), kernels=attention_kernels(active))
        self.f = _initial_density(grid, f0)
        self.n_steps = 0
        self.n_regrids = 0  # grid changes during the run (Grid.regrid)
        self._cfl_since_regrid = 0.0  # CFL steps (fractions for shorter steps) since the last regrid
        # one evaluator per attention head of every layer (its caches, and the memory of its choices that the
        # checkpoint keeps), with the head's key in the model's state ("0.1." for head 1 of term 0)
        self._evaluators, self._eval_keys = {}, []
        # per head, an evaluator for the few cells a regrid made (_refresh_new_cells): its own caches, so that the
        # main one keeps the plans of the whole grid, and a copy of the main one's memory at each call
        self._partial_evaluators = {}
        for prefix, head in _terms.attention_heads(model):
            if id(head) not in self._evaluators:
                self._evaluators[id(head)] = head.evaluator()
            self._eval_keys.append((prefix, self._evaluators[id(head)]))
        self._set_grid(grid)
        self.l0 = float(self.f.min())
        self.diag = {k: [] for k in _DIAG_KEYS}
        self._stepper = STEPPERS[self.stepper_name]
        self._controller = StepController(1.0 / self._stepper.embedded_order)
        self._dt_next = np.inf  # the controller's proposal for the next step
        self._field_curv = np.inf  # relative second divided difference of the last three fields
        self._field_step = 0  # n_steps at the last field recomputation
        self._force_field = False  # recompute the field at the step start now (_refresh_field_after_reject)
        self._field_err = 0.0  # measured extrapolation error at the recomputation of this step
        self._history_moved = False  # the history was moved onto a new grid since the last recomputation
        self._nodes = []  # node times of field_time="interpolate" (kept across regrids; weights are per grid)
        self._node_errs = []  # the predicted error of the interval that ends at each node
        self._node_h = np.nan  # the spacing proposed for the next node (NaN: none yet)
        self._clip_warned = False  # the noise's positivity fix has been warned about
        self._activate(self.t)
        self._mom = self._state_moments()  # moments of the current state, reused by step()
        self._record()

    # ------------------------------------------------------------------ the grid in force
    def _set_grid(self, grid):
        """Make ``grid`` the grid of the run: every array and cache that belongs to a grid is (re)made here,
        in one place, for every grid (a grid that adapts changes during the run: :meth:`Grid.regrid`)."""
        self.grid = grid
        d = grid.dim
        N, F = grid.n_cells, grid.n_faces
        self._g = np.zeros((N, d))  # gradients and face fluxes: limiter="maximum" only
        self._flux = np.empty(F)
        self._outflow = None  # per cell and face outflows of the fused stage kernel
        self._logf = None  # log f of the log-quadratic stage
        self._rate = np.empty(N)
        self._div = np.empty(N)
        self._buffers = [np.empty(N), np.empty(N)]  # stage outputs; never alias self.f
        self._pool = []  # (face moments, cell-major moments) pairs of this grid, reused when nobody holds them
        self._offsets = None  # face point offsets of limiter="maximum"
        self._rates_of = []  # the last moment sets (face moments array, (rate, div)) whose rates were computed
        self._blocks = None  # (block index per cell, number of blocks) of the error norm
        self._vtw = {}  # id(head) -> face normals times V of that head (the fused weights kernel)
        self._diffusion = None  # spherepde.diffusion.DiffusionOperators of the grid, built on first use
        self._steady_cache = {}  # (interval, "all" | "local", ...) -> moments or weights of steady local fields
        self._carried = {}  # key -> (the grid a regrid came from, its steady local weights): _steady_weights
        self._timed = []  # the last two (interval, t, moments) of time-dependent local fields
        self._history: list[tuple[float, np.ndarray]] = []  # (t, face weights a) for field_interval (per grid)
        self._node_a = {}  # node time -> [face weights, moments, cell rates] of field_time="interpolate" (this grid)
        self._stage_times = ()  # the attempt's stage times after its first (field_time="interpolate": pairs)
        self._prefetched = {}  # stage time -> moments made in one pass with another stage's (_interpolated_moments)
        self._side4_of = None  # (moments side, its compact copy) of the compact stage kernel (_side4)
        self._extrema = None  # (f, min f, max f) of the state step() just made, for _record

    @property
    def stepper_name(self) -> str:
        """The stepper in use: ``Options.stepper``, with "auto" resolved (SSP-RK(4,3); SSP-RK3 for a model
        with noise, whose splitting error the embedded estimate does not see)."""
        name = self.options.stepper
        if name == "auto":
            name = "ssprk3" if _terms.has_noise(self.model) else "ssprk43"
        return name

    @property
    def _regrid_every(self) -> int:
        """Steps of this stepper at the CFL limit between regrids (0: the grid never changes)."""
        every = int(getattr(self.grid, "regrid_interval", 0) or 0)
        return max(1, int(round(every / self._stepper.ssp_coefficient))) if every > 0 else 0

    def _maybe_regrid(self):
        """Every ``grid.regrid_interval`` CFL steps, let the grid adapt to the density (:meth:`Grid.regrid`);
        the density moves conservatively with it. A uniform grid never changes (interval 0). A stepper of
        SSP coefficient c takes steps c times as long, so it regrids every interval / c steps (at least
        every step): a feature moves as far between regrids whatever the stepper.

        The steps are counted by their length against the CFL step, or ``max_dt`` where that is shorter
        (``_cfl_since_regrid``): a step the error control or a save time made shorter moves the density by less
        than the Courant number the buffer is sized for, and counts as that fraction of a step. At the CFL limit
        this is every interval / c steps, as before; in the terminal phase of Figure 4 at beta 100 (nside_max
        128) the error control's steps are 0.3-0.4 of the CFL step, and a regrid every 2 steps would come
        2.5-3 times as often as the density's motion asks for."""
        every = self._regrid_every
        if every <= 0 or self._cfl_since_regrid < every - 1e-9:
            return
        self._cfl_since_regrid = 0.0
        # the pooled moment arrays nobody holds, and the heads' face weights, are dropped before the new grid
        # is built beside the old one (a changed grid's go anyway; an unchanged one's are remade on demand): up
        # to _POOL pairs of ~320 B a cell and ~290 B a cell a head would otherwise add to the regrid's peak
        self._drop_free_moments()
        self._vtw = {}  # (remade on demand: one product of the face normals by V)
        out = self.grid.regrid(self.f, attention_scale(self._active), quadratic=self.options.scheme == "quadratic",
                               kernels=attention_kernels(self._active))
        if out is None:
            return
        grid, f = out
        old, history = self.grid, self._history
        carried = {k: (old, a) for k, a in self._steady_cache.items() if k[-1] == "weights"}
        self.f = f
        self._set_grid(grid)
        self._carried = carried
        self.n_regrids += 1
        self._move_history(old, history)

    def _move_history(self, old, history):
        """Carry the field history of ``field_interval`` (the heads' means at the cell centres) from the grid
        ``old`` onto the new one (:meth:`Grid.move_field`) and remake its weights there, so that a regrid
        does not cost three exact fields per step until three fields are known again.

        The move's error is a jump of the field in space, not a variation in time, and it sits in the cells
        the regrid made (refined or coarsened); the cells it kept (:meth:`Grid.kept_cells`) have their old
        means exactly. With the error control, and where the new cells are at most ``_PARTIAL_SHARE`` of
        the grid, the field is recomputed at the new cells alone (:meth:`_refresh_new_cells`) and the jump
        taken out of both history entries there; the kept cells go on extrapolating their history, which
        the error control holds to rtol / 2 as between regrids. Otherwise the next step start recomputes
        the whole field, which measures the jump and takes it out of the history (:meth:`_push_field`).
        Read as curvature instead, a jump of a fixed size over steps of size dt gives |a''| ~ jump / dt^2,
        which the step control answers with a shorter step, whose next regrid brings the next jump: measured
        on an adaptive run at beta 100, nside_max 512, t = 9.35, where move errors of 0.3 % of the field,
        above rtol / 2, took dt from 1e-3 to 1e-10 in 40 steps and held it there. A history without means
        (an older checkpoint's) is dropped, and with it the curvature estimate."""
        if not history or any(ms is None for _, _, ms in history):
            self._field_curv = np.inf
            self._history_moved = False
            return
        d = self.grid.dim
        every = [m for _, _, ms in history for m in ms]
        allm = old.move_field(np.concatenate(every, axis=1), self.grid) if every else None
        entries, k = [], 0
        for t, _, ms in history:  # one move for every entry's every head (the cell matching done once)
            entries.append((t, [np.ascontiguousarray(allm[:, (k + j) * d:(k + j + 1) * d]) for j in range(len(ms))]))
            k += len(ms)
        moved, dm = len(entries) == 2, None
        if moved and self.options.error_control:
            kept = self.grid.kept_cells(old)
            new = None if kept is None else np.flatnonzero(~kept)
            if new is not None and new.size <= _PARTIAL_SHARE * self.grid.n_cells:
                entries, dm = self._refresh_new_cells(entries, new)
                moved = False
        clean = self._clean_faces(old)
        for (t, ms), (_, a_old, _) in zip(entries, history):
            carry = None if clean is None else (a_old,) + clean
            self._history.append((t, self._nonlocal_weights_now(self.f, t=t, means=ms, carry=carry), ms))
        self._history_moved = moved
        if dm is not None:  # the jump's size, measured as _push_field measures one: the step's field error
            (tp, ap, _), (tn, an, _) = self._history
            relative = self._field_measure(self.f, an + (self.t - tn) / (tn - tp) * (an - ap))
            if clean is None:
                jump = sum(wh * self._weights_of_mean(head, shift) for (wh, head), shift in zip(self._heads, dm))
            else:  # zero on the clean faces: the shifts vanish on every cell their gradients read
                dirty = clean[2]
                jump = np.zeros(self.grid.face_points.shape[:2])
                jump[dirty] = sum(wh * self._weights_of_mean(head, shift, faces=dirty)
                                  for (wh, head), shift in zip(self._heads, dm))
            self._field_err = max(self._field_err, relative(jump))

    def _clean_faces(self, old):
        """(rows, src, dirty) after a regrid from ``old``: the faces whose attention weights, for means that
        kept their values on the cells the regrid kept, are those of ``old``'s faces ``src`` bit for bit (a
        face of :meth:`Grid.kept_faces` between two cells of :meth:`Grid.kept_stencils`: the same Gauss
        points and normals, and the same means and gradients on both sides), and the others (``dirty``);
        None where that does not hold or is not known: the grids do not say, the model has local terms
        (their weights are not carried here) or a head without the fused form, or the field is third order.
        A regrid changes ~0.5 % of the cells (the beta 300 transition-law member at nside_max 1024, t = 2.4:
        300-900 of 140k), so the history's weights are remade on a few per cent of the faces, not all."""
        if self._high_order_field or self._local_terms or \
                any(getattr(head, "value_matrix", None) is None for _, head in self._heads):
            return None
        kept, same = self.grid.kept_faces(old), self.grid.kept_stencils(old)
        if kept is None or same is None:
            return None
        rows, src = kept
        ok = same[self.grid.owner[rows]] & same[self.grid.neighbour[rows]]
        dirty = np.ones(self.grid.n_faces, bool)
        dirty[rows[ok]] = False
        return rows[ok], src[ok], np.flatnonzero(dirty)

    def _refresh_new_cells(self, entries, cells):
        """(entries, shifts): the moved history ``entries`` [(t_p, means), (t_n, means)] with the means at
        ``cells`` (the cells a regrid made) shifted so that their extrapolation to now is the field
        recomputed there for the present density (the slope the move gave them is kept, its jump taken out,
        as :meth:`_push_field` does on the whole grid), and the shift of each head's means (zero at the
        other cells)."""
        (tp, mp), (tn, mn) = entries
        c = (self.t - tn) / (tn - tp)
        dm = []
        for (_, head), n, q in zip(self._heads, mn, mp):
            d = np.zeros_like(n)
            if cells.size:
                d[cells] = self._grid_mean_field(self.f, head, cells=cells) - (n[cells] + c * (n[cells] - q[cells]))
            dm.append(d)
        return [(tp, [q + d for q, d in zip(mp, dm)]), (tn, [n + d for n, d in zip(mn, dm)])], dm

    # ------------------------------------------------------------------ the model in force
    def _activate(self, t: float, reset: bool = True):
        """Resolve the model on the layer interval that starts at t (:func:`spherepde.models.terms.resolve`)
        into its local terms and attention heads. Entering a new layer drops the extrapolation history of
        the field (``field_interval``): the weights jumped."""
        key = _terms.interval_index(self._bounds, t)
        if key == self._active_key:
            return
        if self._active_key is not None and reset:
            self._history = []
            self._history_moved = False
            self._field_curv = np.inf
            self._nodes, self._node_a, self._node_h = [], {}, np.nan
        self._active_key = key
        self._active = _terms.resolve(self.model, t)
        self._local_terms, self._heads = _terms.decompose(self._active)
        self._diffusivity = _terms.noise_diffusivity(self._active)  # sigma^2 / 2 of the noise in force

    # ------------------------------------------------------------------ velocity -> moments
    def _normal_weights(self, v_points: np.ndarray, faces=None) -> np.ndarray:
        normals = self.grid.face_normals if faces is None else self.grid.face_normals[faces]
        return np.einsum("fgk,fgk->fg", v_points, normals)

    def _face_velocity(self, t: float, f: np.ndarray, terms=None, faces=None, field=None) -> np.ndarray:
        """Velocity of the local model in force (or of the local ``terms``, or the point-wise ``field(points)``)
        at the face Gauss points, (F, G, d); at the faces ``faces`` alone (an index array) when given."""
        grid = self.grid
        pts = grid.face_points if faces is None else grid.face_points[faces]
        F, G, d = pts.shape
        pts = pts.reshape(-1, d)
        if field is not None:
            v = field(pts)
        elif terms is None:
            v = self._active.field(pts, t)
        else:
            v = sum(np.asarray(m.field(pts, t), float) for m in terms)
        return np.asarray(v, float).reshape(F, G, d)

    def _steady_weights(self, kind, t: float, f: np.ndarray, terms=None, field=None) -> np.ndarray:
        """Normal-velocity weights (F, G) of the steady local model in force (``kind`` "all"), of the steady
        local ``terms`` of a nonlocal one ("local"), or of a steady point-wise ``field`` (the modes of
        ``Prescribed.separable``: ``("mode", k)``), evaluated once per grid and layer. After a regrid the
        faces the new grid kept (:meth:`Grid.kept_faces`: the same points and normals, bit for bit) take their
        weights from the grid it came from, and the field is evaluated at the other faces alone: the same
        bits as evaluating it everywhere (the field is point-wise), at a few percent of the faces. Measured on
        the zero-temperature adaptive study (nside 8 .. 64, 147 regrids), where the face velocities of every
        regrid were a third of the run."""
        key = (self._active_key, kind, "weights")
        a = self._steady_cache.get(key)
        if a is not None:
            return a
        old, a_old = self._carried.pop(key, (None, None))
        kept = None if old is None else self.grid.kept_faces(old)
        if kept is None:
            a = self._normal_weights(self._face_velocity(t, f, terms, field=field))
        else:
            rows, src = kept
            a = np.empty(self.grid.face_points.shape[:2])
            a[rows] = a_old[src]
            todo = np.ones(self.grid.n_faces, bool)
            todo[rows] = False
            new = np.flatnonzero(todo)
            if new.size:
                a[new] = self._normal_weights(self._face_velocity(t, f, terms, faces=new, field=field), faces=new)
        # kept for a regrid to carry (and the local terms' always, which nothing else keeps); a grid that never
        # regrids keeps the moments made from "all" and the modes' stack alone (F x G doubles less: 75 MB a mode
        # at nside 256)
        if kind == "local" or self._regrid_every:
            self._steady_cache[key] = a
        return a

    def _local_weights(self, t: float, f: np.ndarray):
        """Normal-velocity weights (F, G) of the local terms of a nonlocal model (None if it has none);
        the steady ones are evaluated once per layer."""
        steady = [m for m in self._local_terms if getattr(m, "steady", False)]
        moving = [m for m in self._local_terms if not getattr(m, "steady", False)]
        a = None
        if steady:
            a = self._steady_weights("local", t, f, steady)
        if moving:
            am = self._normal_weights(self._face_velocity(t, f, moving))
            a = am if a is None else a + am
        return a

    def _nonlocal_weights_now(self, f: np.ndarray, fused: bool = True, t: float | None = None,
                              means: list | None = None, carry=None) -> np.ndarray:
        """Normal-velocity weights a (F, G) of the model in force for the density f: its local terms plus
        sum_h w_h a_h over its attention heads (:func:`spherepde.models.terms.decompose`). ``means``: the
        heads' means at the cell centres (:meth:`_head_means`), when they are known already. ``carry``:
        (a_old, rows, src, dirty) of :meth:`_clean_faces` after a regrid, a_old the weights of these means
        on the old grid: the rows copied from there, the dirty faces computed (the same bits as computing
        all)."""
        t = self.t if t is None else t
        if means is None:
            means = self._head_means(f)
        if carry is not None:
            a_old, rows, src, dirty = carry
            a = np.empty(self.grid.face_points.shape[:2])
            a[rows] = a_old[src]
            sub = None
            for (w, head), m in zip(self._heads, means):
                ah = self._weights_of_mean(head, m, fused, faces=dirty)
                sub = w * ah if sub is None else sub + w * ah
            a[dirty] = sub
            return a
        a = self._local_weights(t, f)
        for (w, head), m in zip(self._heads, means):
            ah = self._weights_of_mean(head, m, fused)
            a = w * ah if a is None else a + w * ah
        return a

    def _head_means(self, f: np.ndarray) -> list:
        """The attention mean of every head in force at the cell centres, [(N, d), ...]."""
        return [self._grid_mean_field(f, head) for _, head in self._heads]

    def _head_weights(self, model, f: np.ndarray, fused: bool = True) -> np.ndarray:
        """Normal-velocity weights a (F, G) of one nonlocal (attention-type) term for the density f."""
        return self._weights_of_mean(model, self._grid_mean_field(f, model), fused)

    def _weights_of_mean(self, model, m: np.ndarray, fused: bool = True, faces=None) -> np.ndarray:
        """Normal-velocity weights a (F, G) of one nonlocal (attention-type) term from its mean m at the
        cell centres (linear in m).

        m is interpolated to the Gauss points with least-squares gradients (second order). For fields of
        the attention form v = P_x(V m) the weights come from one fused kernel (a = m . V^T W); other
        models go through ``velocity_from_mean``. ``faces``: at those faces alone, (len(faces), G), the
        fused form only (the gradients at their cells alone; the same bits as the rows of all).
        """
        grid = self.grid
        if faces is not None:
            o, n = grid.owner[faces], grid.neighbour[faces]
            cells = np.unique(np.concatenate([o, n])).astype(np.int64)
            grad = np.empty((grid.n_cells,) + m.shape[1:] + (grid.dim,))
            fv.vector_gradient_at(m, cells, grid.stencil, grid.stencil_coef, grad)
            a = np.empty((len(faces), grid.face_points.shape[1]))
            fv.attention_normal_weights(m, grad, grid.xbar, o, n, grid.face_points[faces],
                                        self._vtw_of(model, faces), a)
            return a
        F, G, d = grid.face_points.shape
        if self._high_order_field:  # the quadratic scheme: the field third order too
            coef = grid.center_quadratic_coef
            mq = np.ascontiguousarray(np.einsum("nsr,nsc->ncr", coef, m[grid.stencil] - m[:, None, :]))
            pa, pb = quadratic_pair_arrays(d)
            mg = np.empty((F, G, d))
            fv.interpolate_to_faces_quadratic(m, mq, grid.centers, grid.tangent_basis, pa, pb, grid.owner,
                                              grid.neighbour, grid.face_points, mg)
            if fused and getattr(model, "value_matrix", None) is not None:
                return np.einsum("fgc,fgc->fg", mg, self._vtw_of(model))
            v = model.velocity_from_mean(grid.face_points.reshape(-1, d), mg.reshape(-1, d)).reshape(F, G, d)
            return self._normal_weights(v)
        grad = np.empty((grid.n_cells, d, d))
        fv.vector_gradient(m, grid.stencil, grid.stencil_coef, grad)
        if fused and getattr(model, "value_matrix", None) is not None:
            vtw = self._vtw_of(model)
            a = np.empty((F, G))
            fv.attention_normal_weights(m, grad, grid.xbar, grid.owner, grid.neighbour, grid.face_points,
                                        vtw, a)
            return a
        mg = np.empty((F, G, d))
        fv.interpolate_to_faces(m, grad, grid.xbar, grid.owner, grid.neighbour, grid.face_points, mg)
        v = model.velocity_from_mean(grid.face_points.reshape(-1, d), mg.reshape(-1, d)).reshape(F, G, d)
        return self._normal_weights(v)

    def _vtw_of(self, model, faces=None) -> np.ndarray:
        """V^T W_g at every face Gauss point for an attention term's V (cached per term); at the faces
        ``faces`` alone (not cached where the whole array is not)."""
        vtw = self._vtw.get(id(model))
        if faces is not None:
            return np.ascontiguousarray(vtw[faces] if vtw is not None else
                                        self.grid.face_normals[faces] @ model.value_matrix)
        if vtw is None:
            vtw = self._vtw[id(model)] = np.ascontiguousarray(self.grid.face_normals @ model.value_matrix)
        return vtw

    @property
    def _high_order_field(self) -> bool:
        """The attention field to third order (sources by ``Grid.source_rule``, quadratic interpolation to
        the faces): with the quadratic scheme, on S^2 and up."""
        return self.options.scheme == "quadratic" and self.grid.dim >= 3

    def _extrapolated_weights(self, t: float, f: np.ndarray):
        """Normal-velocity weights at time t as (a_n, a_p, c): a_n + c (a_n - a_p) (a_p None: a_n itself).

        Recomputed from f (field_interval None), or, with field_interval k, recomputed at a step start and
        extrapolated linearly in time in between (the weights are linear in m, so extrapolating them equals
        extrapolating the field). The extrapolation is left to the moment kernel, which does it on the fly
        (no temporary array). When the field is recomputed is :meth:`_field_due`'s decision."""
        if self.options.field_interval is None:
            return self._nonlocal_weights_now(f, t=t), None, 0.0
        at_start = t == self.t and f is self.f
        if at_start and (not self._history or self._history[-1][0] != t) and self._field_due(t):
            means = self._head_means(f)
            self._push_field(t, self._nonlocal_weights_now(f, t=t, means=means), f, means)
        elif not at_start and self.options.error_control and not np.isfinite(self._field_curv):
            return self._nonlocal_weights_now(f, t=t), None, 0.0  # no error estimate yet: the exact field
        tn, an, _ = self._history[-1]
        if len(self._history) == 1 or t == tn:
            return an, None, 0.0
        tp, ap, _ = self._history[0]
        return an, ap, (t - tn) / (tn - tp)

    def _refresh_field_after_reject(self) -> bool:
        """After a second rejected attempt of a step, recompute the field at the step start if it was
        extrapolated there: the predicted error of an extrapolated field at t + dt, |a''| / 2 (t + dt -
        t_n)(t + dt - t_p), does not vanish as dt does when t_n < t, so a shorter attempt cannot lower it;
        from a field recomputed at t it vanishes with dt. (Found on an adaptive run, beta 30, nside_max 512,
        t = 20.58: the embedded estimate alone was 0.89 of the tolerance, the stale field's 0.14 more, and 60
        halvings of dt changed neither.) Not after the first: a single rejection is nearly always the embedded
        estimate's, which the shorter retry meets with the same field, and the recomputation costs a whole
        field (measured 2026-12-06 in Figure 4's terminal phase at beta 100, nside_max 128, t in [5, 8]: 84
        rejections, none a second one; recomputing after each took 231 whole fields against 207, 21.7-23.9 s
        against 20.4-20.9 s). True when the moments were remade."""
        opt = self.options
        if opt.field_interval is None or not opt.error_control or not self._history \
                or self._history[-1][0] == self.t:
            return False
        self._force_field = True
        try:
            self._mom = self._state_moments()
        finally:
            self._force_field = False
        return True

    def _field_due(self, t: float) -> bool:
        """Recompute the field at this step start? Without error control: every k-th step. With it: also
        until three fields are known (the curvature estimate needs them), and as soon as the extrapolation
        error predicted for the coming step exceeds rtol / 2."""
        opt = self.options
        since = self.n_steps - self._field_step
        if not self._history or since >= opt.field_interval or self._force_field or self._history_moved:
            return True  # (after a regrid: the moved history's jump is measured and taken out at once)
        if not opt.error_control:
            return False
        if not np.isfinite(self._field_curv):
            return True
        dt_guess = self._dt_next if np.isfinite(self._dt_next) else self.diag["dt"][-1] if self.diag["dt"] else 0.0
        return self._field_error_at(t + dt_guess) > 0.5 * opt.rtol

    def _field_error_at(self, s: float) -> float:
        """Predicted relative (density-weighted) error of the linearly extrapolated field at time s:
        |a''| / 2 (s - t_n)(s - t_p), with a'' / 2 the second divided difference of the last three fields."""
        if self.options.field_interval is None or not self.options.error_control \
                or not np.isfinite(self._field_curv):
            return 0.0  # no extrapolation (exact field at every stage until three fields are known)
        (tp, _, _), (tn, _, _) = self._history  # a finite curvature implies two stored fields
        return float(self._field_curv * abs((s - tn) * (s - tp)))

    def _push_field(self, t: float, a: np.ndarray, f: np.ndarray, means: list | None = None):
        """Add a recomputed field; measure how far the extrapolation from the last two was off.

        The measure is relative and weighted by the density the faces carry, sum_f w_f sum_g |da_fg| /
        sum_f w_f sum_g |a_fg| with w_f = f_owner + f_neighbour: a field error moves mass in proportion to
        the density it acts on, so it is measured as a relative error of the flux (the unit of rtol).

        After a regrid moved the history (:meth:`_move_history`) the difference between the recomputed field
        and the extrapolation of the moved one is the move's error (and the extrapolation's): both history
        entries are shifted by it (weights and means: the weights are linear in the means), which keeps their
        slope and the curvature estimate of before the regrid, and the difference is recorded as the
        measured error."""
        self._field_step = self.n_steps
        self._field_err = 0.0
        if len(self._history) == 2 and self.options.error_control:
            (tp, ap, mp), (tn, an, mn) = self._history
            relative = self._field_measure(f, a)
            if self._history_moved:
                c = (t - tn) / (tn - tp)
                jump = a - (an + c * (an - ap))
                self._field_err = relative(jump)
                # (a moved history always has means: _move_history drops one without; the caller passes them)
                dm = [m - (n + c * (n - q)) for m, n, q in zip(means, mn, mp)]
                mp, mn = [q + d for q, d in zip(mp, dm)], [n + d for n, d in zip(mn, dm)]
                self._history = [(tp, ap + jump, mp), (tn, an + jump, mn)]
            else:
                d2 = ((a - an) / (t - tn) - (an - ap) / (tn - tp)) / (t - tp)  # second divided difference
                self._field_curv = relative(d2)
                self._field_err = self._field_curv * (t - tn) * (t - tp)  # = |a - extrapolation(t)| / |a|
        self._history_moved = False
        self._history = (self._history + [(t, a, means)])[-2:]

    def _field_measure(self, f: np.ndarray, a: np.ndarray):
        """The measure of a change da of the face weights ``a`` (F, G) relative to ``a``, weighted by the
        density the faces carry (:meth:`_push_field`): sum_f w_f sum_g |da_fg| / sum_f w_f sum_g |a_fg| with
        w_f = f_owner + f_neighbour, as a function of da (0 where ``a`` carries nothing)."""
        g = self.grid
        w = f[g.owner] + f[g.neighbour]
        scale = float(np.sum(w * np.abs(a).sum(axis=1)))  # not BLAS (see _error_ratio)

        def relative(da):
            return float(np.sum(w * np.abs(da).sum(axis=1))) / scale if scale > 0 else 0.0

        return relative

    def _grid_mean_field(self, f: np.ndarray, model=None, cells=None) -> np.ndarray:
        """The attention mean at the cell centres for the grid density f (midpoint rule over cells); at the
        centres of ``cells`` (indices) only, when given.

        Each attention head is evaluated by its own evaluator (:mod:`spherepde.evaluation`: the method
        choice, the fallback chain and the certified bound); the grid's ``circle_start`` tells it when the
        sums are circular convolutions (a uniform circle grid: the FFT path). What the last evaluation at
        every cell did is in :attr:`field_info`. A subset of cells goes to a second evaluator of the head,
        which starts from the main one's memory and leaves it as it was (the run's bits do not depend on
        when subsets were evaluated), so that the main one keeps its plans for the whole grid.
        """
        grid = self.grid
        model = self._heads[0][1] if model is None else model
        ev = self._evaluators.get(id(model))
        if self._high_order_field:  # a 2 (d - 1)-point rule per cell with the linear variation of f: O(h^3)
            sources, w, hint = grid.source_rule[0].reshape(-1, grid.dim), source_weights(grid, f), None
        else:
            sources, w, hint = grid.centers, f * grid.areas, grid.circle_start
        targets = grid.centers if cells is None else grid.centers[cells]
        if ev is None:  # a nonlocal term of the user's own, with its own mean_field
            return model.mean_field(targets, sources, w)
        if cells is not None:
            pev = self._partial_evaluators.get(id(model))
            if pev is None:
                pev = self._partial_evaluators[id(model)] = model.evaluator()
            pev.memory = dict(ev.memory)
            m, info = pev.mean_field(targets, sources, w)
        else:
            m, info = ev.mean_field(targets, sources, w, circle_phi0=hint)
            self.field_info = info
        self._step_bound = max(self._step_bound, info.bound)
        return m

    def _moments(self, t: float, f: np.ndarray) -> np.ndarray:
        active = self._active
        if active.local and active.steady:
            key = (self._active_key, "all")
            if key not in self._steady_cache:
                self._steady_cache[key] = self._compute_moments(self._steady_weights("all", t, f))
            return self._steady_cache[key]
        if active.local:  # a field of t alone: an accepted step's last stage at t + dt is the next state's
            for key, tk, mom in self._timed:
                if key == self._active_key and tk == t:
                    return mom
            mom = self._local_moments(t, f)
            self._timed = [self._timed[-1], (self._active_key, t, mom)] if self._timed else [(self._active_key, t, mom)]
            return mom
        return self._compute_moments(*self._extrapolated_weights(t, f))

    def _local_moments(self, t: float, f: np.ndarray):
        """The moments of a time-dependent local field at t."""
        active = self._active
        if getattr(active, "modes", None):  # v = sum_k c_k(t) v_k: each v_k evaluated once
            key = (self._active_key, "modes")
            if key not in self._steady_cache:  # each mode's weights carried across a regrid (_steady_weights)
                A = np.stack([self._steady_weights(("mode", k), t, f, field=lambda p, k=k: active.mode_field(k, p))
                              for k in range(len(active.modes))])
                self._steady_cache[key] = (A, np.empty(A.shape[1:]))
            A, a = self._steady_cache[key]
            grid = self.grid
            c = active.mode_coefficients(t)
            if len(c) == 1:  # one mode: max(c a, 0) = |c| max(+-a, 0), so the moments of +-v_1 scale
                key1 = (self._active_key, "mode+" if c[0] >= 0 else "mode-")
                if key1 not in self._steady_cache:
                    self._steady_cache[key1] = self._compute_moments(A[0] if c[0] >= 0 else -A[0])
                mom, side = self._steady_cache[key1]
                # the scale travels with the moments (a third element): a stage with moments s m and step
                # dt is the stage with m and s dt, and the rates scale by s, so no scaled copy is made
                return mom, side, abs(float(c[0]))
            if grid.dim == 3 and self.options.scheme == "linear":  # a is not formed (face_side_moments_modes)
                key_w = (self._active_key, "mode tables")
                if key_w not in self._steady_cache:
                    self._steady_cache[key_w] = fv.mode_face_tables(
                        A, grid.face_points, grid.xbar, grid.owner, grid.neighbour,
                        np.linalg.norm(grid.face_normals, axis=2))
                mom, side = self._moment_arrays()
                fv.face_side_moments_modes(A, self._steady_cache[key_w], np.asarray(c, float), grid.face_points,
                                           grid.xbar, grid.tangent_basis, grid.owner, grid.neighbour,
                                           grid.face_slots, mom, side)
                return mom, side
            fv.combine_weights(A, c, a)
            return self._compute_moments(a)
        if self.options.interpolates_field:
            return self._interpolated_moments(t, f)
        return self._exact_moments(t, f)

    def _exact_moments(self, t: float, f: np.ndarray):
        """Moments at t of the time-dependent local field given point-wise, evaluated at t itself
        (``field_time="exact"``, and the intervals the interpolation misses)."""
        out = None
        if getattr(self._active, "kernel", None) is not None:  # the compiled pass writes into one kept array
            key = (self._active_key, "kernel weights")
            if key not in self._steady_cache:
                self._steady_cache[key] = np.empty(self.grid.face_points.shape[:2])
            out = self._steady_cache[key]
        return self._compute_moments(self._weights_at(t, f, out))

    def _weights_at(self, t: float, f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Normal-velocity weights (F, G) at t of the time-dependent local field given point-wise: a
        ``Prescribed.compiled`` kernel in one compiled pass (into ``out``, or a new array), a NumPy
        ``velocity(x, t)`` through :meth:`_face_velocity` (a new array)."""
        kernel = getattr(self._active, "kernel", None)
        if kernel is None:
            return self._normal_weights(self._face_velocity(t, f))
        a = np.empty(self.grid.face_points.shape[:2]) if out is None else out
        if fv.compiled_normal_weights(kernel, self.grid.face_points, self.grid.face_normals, float(t), a):
            raise ValueError(f"the compiled velocity kernel {getattr(kernel, '__name__', kernel)!r} wrote NaN "
                             f"or inf at t = {t}")
        return a

    def _node(self, t: float, f: np.ndarray) -> np.ndarray:
        """The weights at node time t on this grid (evaluated once per grid: a regrid re-evaluates them)."""
        node = self._node_a.get(t)
        if node is None:
            node = self._node_a[t] = [self._weights_at(t, f), None, None]
        return node[0]

    def _node_moments(self, t: float, f: np.ndarray):
        """The moment set at node time t on this grid, with its rates (a set of :meth:`_interpolated_moments`),
        and the per-cell (outflow rate, divergence) they are the maxima of; made once from :meth:`_node`'s
        weights and kept with them. Without the face moments where the stages do not read them."""
        self._node(t, f)
        node = self._node_a[t]
        if node[1] is None:
            g = self.grid
            mom, side = self._compute_moments(node[0], pooled=False)
            node[2] = (np.empty(g.n_cells), np.empty(g.n_cells))
            fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, *node[2])
            node[1] = (None if self._side_only() else mom, side, 1.0, (float(node[2][0].max()),
                                                                       float(node[2][1].max())))
        return node[1], node[2]

    def _node_error(self, i: int, f: np.ndarray) -> float:
        """Predicted relative error of linear interpolation on the interval (nodes[i], nodes[i + 1]):
        |a''| / 2 h^2 / 4, a'' / 2 the second divided difference of nodes i - 1, i, i + 1 (relative to the
        largest L1 size of the three)."""
        tp, ta, tb = self._nodes[i - 1:i + 2]
        wp = 1.0 / ((ta - tp) * (tb - tp))
        wb = 1.0 / ((tb - ta) * (tb - tp))
        d2, scale = fv.second_difference_norms(self._node(tp, f), self._node(ta, f), self._node(tb, f),
                                               wp, -(wp + wb), wb)
        return 0.0 if scale == 0 else d2 / scale * 0.25 * (tb - ta) ** 2

    def _cover(self, t: float, f: np.ndarray):
        """Place nodes until one lies at or after t (``Options.field_time``): each new node at the proposed
        spacing, moved closer while its interval's predicted error exceeds rtol / 2 (never closer than an
        eighth of a step), and the next spacing proposed from the error met (at most twice the last).

        The first interval of a run (or a layer) gets its midpoint as a node too, so that its curvature, and
        with it its error, is known from the start: a run that starts with a long step (a slow field, whose
        CFL step is the whole run) would otherwise interpolate blind across it. An interval that misses the
        target at the closest spacing keeps its error, and :meth:`_interpolated_moments` evaluates the
        field itself there (the method of lines, whose step control then answers a field that jumps)."""
        target = 0.5 * self.options.rtol
        last_dt = self.diag["dt"][-1] if self.diag["dt"] else np.nan
        step = min((x for x in (self._dt_next, last_dt, 2.0 * (t - self.t)) if np.isfinite(x) and x > 0),
                   default=0.0)
        floor = step / 8.0  # a field that jumps: at most ~8 nodes a step, not an endless halving
        while self._nodes[-1] < t:
            ta = self._nodes[-1]
            later = [b for b in self._bounds if b > ta]  # the field of this layer ends there
            h = self._node_h if np.isfinite(self._node_h) else max(2.0 * (t - ta), floor)
            while True:
                at_floor = h <= floor
                tb = ta + max(h, floor)
                if later and tb > later[0]:
                    tb = later[0]
                new = [0.5 * (ta + tb), tb] if len(self._nodes) == 1 else [tb]
                self._nodes.extend(new)
                span = tb - self._nodes[-2]
                err = self._node_error(len(self._nodes) - 2, f)
                if err <= target or at_floor:
                    grow = 2.0 if err == 0 else min(2.0, 0.9 * np.sqrt(target / err))
                    self._node_h = max(grow * span, floor)
                    break
                for tk in new:
                    self._nodes.pop()
                    self._node_a.pop(tk, None)
                h = (tb - ta) * max(0.2, 0.9 * np.sqrt(target / err))
            self._node_errs = (self._node_errs + [err] * len(new))[-len(self._nodes):]

    def _interpolated_moments(self, t: float, f: np.ndarray):
        """Moments at t of the time-dependent local field interpolated linearly between its nodes
        (``Options.field_time = "interpolate"``)."""
        if not self._nodes or t < self._nodes[0]:  # the run's (or the layer's) start
            self._nodes, self._node_a, self._node_h, self._node_errs = [t], {}, np.nan, [0.0]
        self._cover(t, f)
        i = int(np.searchsorted(self._nodes, t, side="right")) - 1  # nodes[i] <= t < nodes[i + 1]
        keep = max(0, int(np.searchsorted(self._nodes, self.t, side="right")) - 2)  # one before the step's
        if keep:
            for tk in self._nodes[:keep]:
                self._node_a.pop(tk, None)
            self._nodes, self._node_errs, i = self._nodes[keep:], self._node_errs[keep:], i - keep
        if self._nodes[i] == t:
            return self._node_moments(t, f)[0]
        ta, tb = self._nodes[i], self._nodes[i + 1]
        if self._node_errs[i + 1] > 0.5 * self.options.rtol:  # missed at the closest spacing (_cover): the field
            return self._exact_moments(t, f)  # itself, as field_time="exact" takes it
        self._field_err = max(self._field_err, self._node_errs[i + 1])  # (_cover: a node after t, its error)
        mom = self._prefetched.pop(t, None)
        if mom is not None:
            return mom
        # the moments, not the weights, are interpolated: (1 + c) M_b - c M_a, c = (t - t_b) / (t_b - t_a) in
        # (-1, 0), a convex combination of two upwind moment sets (outflows >= 0 stay so). Where a Gauss point's
        # weight keeps its sign over the interval this is the moments of the interpolated weights; where it
        # changes sign, the two differ by at most that point's |a_b - a_a| / 4 (the kink of max(a, 0)), on a
        # share of the points that shrinks with the node spacing: second order in it, like the interpolation
        ((ma, sa, _, _), ra), ((mb, sb, _, _), rb) = self._node_moments(ta, f), self._node_moments(tb, f)
        c = (t - tb) / (tb - ta)

        def rates(c):  # the CFL rate and the divergence are linear in the moments: the nodes' per-cell ones
            return fv.lerp_max(rb[0], ra[0], c), fv.lerp_max(rb[1], ra[1], c)

        if not self._side_only():
            mom, side = self._moment_arrays()
            fv.lerp_moments(mb, ma, c, mom)
            fv.lerp_moments(sb, sa, c, side)
            return mom, side, 1.0, rates(c)
        # the stages read the cell-major set alone: no face moments are made
        side = self._moment_arrays()[1]
        other = [u for u in self._stage_times if ta < u < tb and u != t and u not in self._prefetched]
        if other:  # another stage time of this attempt between the same nodes: both sets in one pass (the
            # same bits as two), the other kept for its stage
            u = other[0]
            cu = (u - tb) / (tb - ta)
            side2 = self._moment_arrays()[1]
            fv.lerp_moments_pair(sb, sa, c, cu, side, side2)
            self._prefetched[u] = (None, side2, 1.0, rates(cu))
        else:
            fv.lerp_moments(sb, sa, c, side)
        return None, side, 1.0, rates(c)

    def _side_only(self) -> bool:
        """Interpolated moment sets without face moments (:meth:`_interpolated_moments`): unless the limiter
        reads them in the stage ("maximum"), and while ``_pair_moments`` (a test switch: off, every set is
        made whole and alone)."""
        return self._pair_moments and self.options.limiter != "maximum"

    def _compute_moments(self, a, a_prev=None, c=0.0, pooled=True):
        """Face moments (F, 2 + 2d) and their cell-major outflow copy (N, K, 1 + d), as a pair, from the
        normal-velocity weights a (F, G), or from a + c (a - a_prev) when ``a_prev`` is given; in arrays of
        the pool, or new ones (``pooled`` False: see :meth:`_moment_arrays`)."""
        grid = self.grid
        if a_prev is None:
            a_prev, c = a, 0.0
        quadratic = self.options.scheme == "quadratic"
        mom, side = self._moment_arrays(pooled)
        if self.options.scheme == "log-quadratic":  # the weights point by point (the stage is not linear in them)
            fv.face_side_weights(a, a_prev, c, grid.face_points, grid.xbar, grid.owner, grid.neighbour,
                                 grid.face_slots, mom, side)
            return mom, side
        if quadratic:
            pa, pb = quadratic_pair_arrays(grid.dim)
            fv.face_side_moments_quadratic(a, a_prev, c, grid.face_points, grid.xbar, grid.tangent_basis,
                                           grid.quadratic_coef[1], pa, pb, grid.owner, grid.neighbour,
                                           grid.face_slots, mom, side)
            return mom, side
        fv.face_side_moments(a, a_prev, c, grid.face_points, grid.xbar, grid.tangent_basis, grid.owner,
                             grid.neighbour, grid.face_slots, mom, side)
        return mom, side

    def _drop_free_moments(self):
        """Drop the pooled moment pairs nobody holds (the test of :meth:`_moment_arrays`, in the loop pattern
        _FREE_REFS was measured in); the held ones stay pooled."""
        held = []
        for mom, side in self._pool:
            if not (_refs(mom) == _FREE_REFS and _refs(side) == _FREE_REFS):
                held.append((mom, side))
        self._pool = held

    def _moment_arrays(self, pooled: bool = True):
        """Face moments (F, 2 + 2d) and cell-major moments (N, K, 1 + d[+ quadratic]) to be filled, the
        padding slots of the latter zeroed (the kernels leave them alone). ``pooled`` False: a new pair
        outside the pool, for moments kept apart from the step's sets (a time node's, whose face moments
        are dropped while its cell-major set is kept: pooled, the pair would stay held whole).

        No array is handed out while anything still holds it: moments are memoised by identity
        (:meth:`_rates`, :meth:`_moments`) and kept across steps. A pair nobody else references (its
        reference counts are the pool's own) is reused; otherwise a new pair is made and pooled (at most
        ``_POOL`` pairs). Why: a fresh array of this size is mapped anew by the allocator and every page
        faults on first write, which cost 45 % of a two-mode field's moment pass at nside 256
        (``validation/bench_transport.py``). The price is memory: a pair released by the memos stays in the
        pool (attention at nside 64, field_interval 4: peak +9.4 MB, 0.86 of a pair)."""
        grid = self.grid
        for mom, side in self._pool if pooled else ():
            if _refs(mom) == _FREE_REFS and _refs(side) == _FREE_REFS:  # only the pool's tuple (and this loop)
                return mom, side
        mom = np.empty((grid.n_faces, fv.moment_width(grid.dim)))
        L, Q = quadratic_width(grid.dim)
        # (q, Q in the cell's tangent frame[, quadratic moments]), or the log-quadratic scheme's point weights
        width = {"quadratic": 1 + L + Q, "log-quadratic": grid.face_points.shape[1]}.get(self.options.scheme, grid.dim)
        # zeroed whole (the padding slots must be zero, and the kernels never write them): a fresh mapping's
        # zero pages, where zeroing the padding slots alone by index took 12-14 ms at 143k cells, against
        # ~2 ms, five times per regrid of an adaptive run (measured 2026-12-07)
        side = np.zeros(grid.cell_faces.shape + (width,))
        if pooled and _FREE_REFS and len(self._pool) < _POOL:
            self._pool.append((mom, side))
        return mom, side

    # ------------------------------------------------------------------ one step
    def _rhs_stage(self, fa, fb, mom, dt, alpha, out):
        grid, opt = self.grid, self.options
        if len(mom) > 2:  # moments (m, side, s) stand for s m: every stage kernel is linear in dt m
            dt = dt * mom[2]
        linear = opt.scheme == "linear"
        if linear and opt.limiter == "maximum":  # gradient, two scalings, then the face fluxes
            cls, coef = grid.stencil_classes
            fv.limited_gradient(fb, grid.stencil, cls, coef, grid.tangent_basis, mom[1], grid.areas, dt, True,
                                self._g)
            fv.local_bounds_scale(fb, grid.stencil, self._point_offsets(), self._g)
            fv.face_flux(fb, self._g, grid.owner, grid.neighbour, mom[0], self._flux, True)
            fv.cell_update(fa, fb, self._flux, grid.cell_faces, grid.cell_face_sign, grid.areas, dt, alpha,
                           out, True)
            return
        if self._outflow is None:
            self._outflow = np.empty(grid.cell_faces.size)
        if opt.scheme == "log-quadratic":
            if self._logf is None:
                self._logf = np.empty(grid.n_cells)
            fv.log_values(fb, self._logf)
            cls, coef = grid.log_quadratic_classes
            fv.stage_update_log(fa, fb, self._logf, grid.stencil_offsets, cls, coef, grid.cell_points,
                                grid.cell_weights, mom[1], grid.cell_faces, grid.face_points, grid.xbar,
                                grid.tangent_basis, grid.inflow_offsets, grid.kernel_areas, dt, alpha,
                                opt.limiter != "none", self._outflow, out)
            return
        if opt.scheme == "quadratic":
            cls, coef = grid.quadratic_classes
            fv.stage_update_quadratic(fa, fb, grid.stencil_offsets, cls, coef, mom[1], grid.inflow_offsets,
                                      grid.kernel_areas, dt, alpha, opt.limiter != "none", self._outflow, out)
            return
        cls, coef = grid.stencil_classes
        split = grid.kernel_split if (linear and opt.limiter != "none") else None
        if split is not None:  # mixed stencil sizes (adaptive HEALPix): each cell looped over its own (the same bits)
            stencil4, in4, in_large, n_out = grid.kernel_compact
            if self._outflow.size != n_out:
                self._outflow = np.empty(n_out)
            fv.stage_update_compact(fa, fb, stencil4, grid.stencil_offsets, cls, coef, self._side4(mom[1]), mom[1],
                                    in4, in_large, grid.kernel_areas, dt, alpha, split[0], split[1], self._outflow,
                                    out)
            return
        fv.stage_update(fa, fb, grid.stencil_offsets, cls, coef, mom[1], grid.inflow_offsets, grid.kernel_areas,
                        dt, alpha, linear, opt.limiter != "none", self._outflow, out)

    def _side4(self, side: np.ndarray) -> np.ndarray:
        """The first 4 face slots of the cell-major moments ``side`` as a compact (N, 4, 3) copy (what the
        compact stage kernel's small cells read), made once per moment set: memoised on the last set by
        identity, which it holds (so the moments pool does not reuse that set while the copy stands for it)."""
        memo = self._side4_of
        if memo is not None and memo[0] is side:
            return memo[1]
        shape = side.shape[:1] + (4,) + side.shape[2:]
        # the copy never leaves this solver (it is handed straight to the kernel): its buffer is reused
        side4 = memo[1] if memo is not None and memo[1].shape == shape else np.empty(shape)
        fv.compact_side(side, side4)
        self._side4_of = (side, side4)
        return side4

    def _point_offsets(self) -> np.ndarray:
        """X_g - xbar_i for every face Gauss point of every cell, (N, K, G, d) (for limiter="maximum")."""
        if self._offsets is None:
            g = self.grid
            pts = g.face_points[g.cell_faces]  # (N, K, G, d)
            off = pts - g.xbar[:, None, None, :]
            off[g.cell_face_sign == 0] = 0.0
            self._offsets = np.ascontiguousarray(off)
        return self._offsets

    def _rates(self, mom):
        """(max outflow Courant rate, max discrete div v) of a moment set. Memoised on the last three sets
        (by identity; the sets are kept alive here): the same moments are asked for by the diagnostics
        after a step and by the next step, and a time-dependent local field's last stage is the next
        state's (:meth:`_moments`). A set without face moments carries its rates (:meth:`_interpolated_moments`)."""
        if len(mom) > 3:  # (m or None, side, 1, (rate, div))
            return mom[3]
        s = mom[2] if len(mom) > 2 else 1.0  # moments (m, side, s) stand for s m (s >= 0)
        for m0, rates in self._rates_of:
            if m0 is mom[0]:
                rate, div = rates
                break
        else:
            g = self.grid
            fv.cell_rates(mom[0], g.cell_faces, g.cell_face_sign, g.areas, self._rate, self._div)
            rate, div = float(self._rate.max()), float(self._div.max())
            self._rates_of = (self._rates_of + [(mom[0], (rate, div))])[-3:]
        return (rate, div) if s == 1.0 else (s * rate, s * div)

    def _record(self):
        _, sup_div = self._rates(self._mom)
        d = self.diag
        d["time"].append(self.t)
        d["mass"].append(self.grid.mass(self.f))
        ext = self._extrema
        lo, hi = ext[1:] if ext is not None and ext[0] is self.f else (float(self.f.min()), float(self.f.max()))
        d["min"].append(lo)
        d["max"].append(hi)
        d["sup_div"].append(sup_div)

    def step(self, dt_max: float = np.inf, t_land: float | None = None) -> float:
        """Advance one accepted step; returns its size.

        The step is min(CFL step, ``max_dt``, ``dt_max``, the error controller's proposal); attempts whose
        estimated error ratio exceeds 1 (or whose later stages exceed Courant number 1) are rejected and
        retried smaller. Every accepted step is an SSP step within the CFL limit: positive, mass exact.
        ``t_land``: the time a step of size ``dt_max`` ends at exactly (a save time, a layer start)."""
        opt, st = self.options, self._stepper
        mom = self._mom
        rate, _ = self._rates(mom)
        dt_cfl = opt.cfl * st.ssp_coefficient / rate if rate > 0 else np.inf
        dt_free = min(dt_cfl, opt.max_dt, self._dt_next if opt.error_control else np.inf)
        dt = min(dt_free, dt_max)
        if not np.isfinite(dt):
            raise ValueError("the velocity is zero everywhere and no dt_max was given")
        rejected, err = 0, 0.0
        tiny = 1e-14 * max(1.0, abs(self.t))
        while True:
            # a tiny step that only lands on the target (t_end = 1e-300, a save time just ahead) is fine
            if (dt <= tiny and (rejected > 0 or dt < dt_max)) or rejected >= 60:
                raise RuntimeError(f"step size underflow at t = {self.t} (dt = {dt:.3e} after {rejected} "
                                   f"rejected attempts): the error estimate cannot meet rtol = {opt.rtol:g}, "
                                   f"atol = {opt.atol:g}; loosen them or check the model")
            u0, mom0 = self.f, mom
            if self._diffusivity > 0:  # Strang splitting: noise dt/2, transport dt, noise dt/2
                u0 = self._heat(self.f, 0.5 * dt)
                mom0 = mom if self._active.local else self._moments(self.t, u0)
            vals = self._try_step(st, mom0, dt, u0)
            if vals is None:  # a later stage's field exceeded Courant number 1: retry smaller
                dt *= 0.5
                rejected += 1
                continue
            f_new = vals[len(st.stages)]
            if self._diffusivity > 0:
                f_new = self._heat(f_new, 0.5 * dt)
            lo, hi = float(f_new.min()), float(f_new.max())  # NaN propagates into both; +-inf shows in one
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise FloatingPointError(f"non-finite density after the step from t = {self.t}")
            if not opt.error_control:
                break
            err = self._error_ratio(vals, dt)
            if err <= 1.0:
                break
            dt *= self._controller.factor(err, after_reject=True)
            rejected += 1
            # a second rejection (the first is nearly always the embedded estimate's, which the shorter retry
            # meets with the same field): see _refresh_field_after_reject
            if rejected >= 2 and self._refresh_field_after_reject():
                mom = self._mom  # the step start's moments from the field just recomputed
        if opt.error_control:
            proposal = dt * self._controller.factor(err, after_reject=rejected > 0)
            if dt_max < dt_free and rejected == 0:  # shortened to land on a time: keep the free proposal
                proposal = max(proposal, self._dt_next)
            self._dt_next = proposal
        self._extrema = (f_new, lo, hi)  # for _record, which the step ends with
        d = self.diag
        for k, v in zip(_STEP_KEYS, (dt, err, rejected, self._field_err, self._step_bound)):
            d[k].append(float(v))
        self._field_err = 0.0
        self._step_bound = 0.0
        self.f = f_new
        self.t = t_land if (t_land is not None and dt == dt_max) else self.t + dt
        self.n_steps += 1
        # the step's share of a CFL step (or of max_dt, where that is shorter): 1 at that limit, less where the
        # error control or a save time made it shorter; how far the density moved, relative to the Courant number
        # the regrid buffer is sized for (_maybe_regrid). With noise the heat steps spread it too, whatever the
        # velocity: every step counts whole, as before
        self._cfl_since_regrid += 1.0 if self._diffusivity > 0 else min(1.0, dt / min(dt_cfl, opt.max_dt))
        self._maybe_regrid()
        self._mom = self._state_moments()
        self._record()
        return dt

    def _state_moments(self):
        """The moments of the current state. The model's own state (:meth:`Model.get_state`) is kept as it
        was just before: the checkpoint stores that, so that a resume recomputes these moments with the
        same history, gets the same bits, and leaves the model where the uninterrupted run left it."""
        self._model_before = self._model_state()
        self._activate(self.t)
        return self._moments(self.t, self.f)

    @property
    def evaluators(self) -> dict:
        """The attention evaluators of the run by head key (:func:`spherepde.models.terms.attention_heads`:
        "" for a single head), each with its ``memory`` and caches."""
        return {prefix: ev for prefix, ev in self._eval_keys}

    def _model_state(self) -> dict:
        """The model's own state (:meth:`Model.get_state`, for models of the user's own) and that of the
        attention evaluators, each under its head's key in the model ("series_pass", "0.1.series_pass")."""
        state = dict(getattr(self.model, "get_state", dict)())
        for prefix, ev in self._eval_keys:
            state.update({prefix + k: v for k, v in ev.get_state().items()})
        return state

    def _set_model_state(self, state: dict):
        if hasattr(self.model, "set_state"):  # a duck-typed model may have no state
            self.model.set_state(state)
        done = set()
        for prefix, ev in self._eval_keys:
            if id(ev) not in done:
                done.add(id(ev))
                ev.set_state({k[len(prefix):]: v for k, v in state.items()
                              if k.startswith(prefix) and "." not in k[len(prefix):]})

    def _error_ratio(self, vals, dt: float) -> float:
        """The step's error ratio err (accept when <= 1): the embedded estimate in the mass norm over
        atol * mass + rtol * (the step's change), plus the predicted error of an extrapolated field."""
        opt, st = self.options, self._stepper
        u0, un = vals[0], vals[len(st.stages)]
        e = un.copy()
        for w, v in zip(st.embedded, vals):
            if w:
                e -= w * v
        change = self._block_norm(un - u0)
        num = self._block_norm(e) + self._field_error_at(self.t + dt) * change
        # grid.mass, not u0 @ areas: a BLAS dot right after the Numba kernels waits for their spinning
        # threads (measured 3.3 ms per step at nside 98, half the cost of the step; a plain sum: 0.05 ms)
        den = opt.atol * self.grid.mass(u0) + opt.rtol * change
        if den > 0:
            return num / den
        return 0.0 if num == 0 else np.inf

    def _block_norm(self, g: np.ndarray) -> float:
        """sum over the grid's error blocks of |sum_{i in block} g_i |C_i||: the mass norm at twice the
        cell size (see ``Grid.error_blocks`` for why)."""
        if self._blocks is None:
            self._blocks = (np.asarray(self.grid.error_blocks), int(np.max(self.grid.error_blocks)) + 1)
        idx, nb = self._blocks
        return float(np.abs(np.bincount(idx, weights=g * self.grid.areas, minlength=nb)).sum())

    def _buffer(self, i: int) -> np.ndarray:
        while len(self._buffers) <= i:
            self._buffers.append(np.empty(self.grid.n_cells))
        return self._buffers[i]

    def _heat(self, f: np.ndarray, t: float) -> np.ndarray:
        """The noise term's heat flow over time t (:func:`spherepde.diffusion.heat_flow`)."""
        from .diffusion import DiffusionOperators, heat_flow

        if self._diffusion is None:
            self._diffusion = DiffusionOperators(self.grid)
        before = self._diffusion.n_clipped
        out = heat_flow(self._diffusion, f, t, self._diffusivity)
        if self._diffusion.n_clipped > before and not self._clip_warned and self._diffusion.clipped_mass > 1e-6:
            self._clip_warned = True
            log.warning("noise at t = %.4g: the heat flow had negative cells holding %.2g of the mass, set to 0 "
                        "(the density is not resolved near zero; Solver.noise_clipped)", self.t,
                        self._diffusion.clipped_mass)
        return out

    def _try_step(self, st: SSPStepper, mom0, dt, u0=None):
        """Stage values [u_0, u_1, ..., u_S, extra...] of one attempt from ``u0`` (default the state), or
        None if a stage exceeded Courant number 1. The answer u_S is a fresh array (callers may keep it);
        the others reuse buffers."""
        shifted = u0 is not None and u0 is not self.f
        u0 = self.f if u0 is None else u0
        hs = st.stage_fractions  # stage s is a forward-Euler step of hs[s] * dt
        if shifted and hs[0] * dt * self._rates(mom0)[0] > 1.0:  # moments of a diffused state: check the CFL too
            return None
        prev = u0
        vals = [u0]
        n_main = len(st.stages)
        stages = st.stages + (st.extra if self.options.error_control else ())
        if self.options.interpolates_field:  # (_interpolated_moments: moments in pairs)
            self._stage_times = tuple(sorted({self.t + c * dt for _, c in stages[1:]}))
        try:
            for s, (alpha, c) in enumerate(stages):
                if s == 0:
                    mom = mom0
                else:
                    mom = self._moments(self.t + c * dt, prev)
                    if hs[s] * dt * self._rates(mom)[0] > 1.0:
                        return None
                out = np.empty_like(u0) if s == n_main - 1 else self._buffer(s)
                self._rhs_stage(u0, prev, mom, hs[s] * dt, alpha, out)
                vals.append(out)
                prev = out
        finally:  # the pairs serve this attempt only
            self._stage_times = ()
            self._prefetched.clear()
        return vals

    def check_step_budget(self, t_end: float):
        """Refuse up front a run to ``t_end`` that cannot finish within ``max_steps`` (issue #21 item 9:
        ``t_end = 1e300`` or a field scaled by 1e200 ran for hours until max_steps).

        No step can exceed the CFL step (or ``max_dt``), so (t_end - t) / dt_cfl is a lower bound on the
        steps needed. For a local steady field (ZeroTemperature, Prescribed without time dependence) the
        CFL step never changes and a bound above the steps left is a ``ValueError``; for fields that
        change with the density or in time it is estimated from the current field and only logged."""
        opt = self.options
        rate, _ = self._rates(self._mom)
        dt_up = min(opt.cfl * self._stepper.ssp_coefficient / rate if rate > 0 else np.inf, opt.max_dt)
        if not np.isfinite(dt_up) or t_end <= self.t:
            return
        need = (t_end - self.t) / dt_up
        left = opt.max_steps - self.n_steps
        if need <= left:
            return
        msg = (f"t_end = {t_end:g} needs at least {need:.3g} steps from t = {self.t:g} (the step is at most "
               f"{dt_up:.3g}: cfl = {opt.cfl:g} times the stepper's SSP coefficient over the field's Courant rate, and max_dt = {opt.max_dt:g}), more "
               f"than the {left} left of max_steps = {opt.max_steps}: shorten t_end, raise cfl or max_dt, or raise "
               f"Options.max_steps (config scheme.max_steps)")
        # a field that changes with the density or in time may speed up or slow down, but not by a factor
        # 100 over a run: beyond that the estimate is refused too
        if (getattr(self.model, "local", False) and getattr(self.model, "steady", False)) or need > 100 * left:
            raise ValueError(msg)
        log.warning("%s (estimated from the current field, which changes)", msg)

    def advance(self, t_target: float, callback: Callable | None = None):
        """Step until ``t_target`` exactly (the last step is shortened to land on it)."""
        while self.t < t_target:
            if self.n_steps >= self.options.max_steps:
                raise RuntimeError(f"max_steps = {self.options.max_steps} reached at t = {self.t}")
            land = min(t_target, _terms.next_boundary(self.model, self.t, self._bounds))
            self.step(dt_max=land - self.t, t_land=land)
            if t_target - self.t <= 1e-13 * max(1.0, abs(t_target)):
                self.t = t_target
                self.diag["time"][-1] = t_target
            if callback is not None:
                callback(self)

    @property
    def noise_clipped(self) -> tuple[int, float]:
        """(heat flows with negative cells, the largest negative mass set to 0 relative to the mass) of the
        noise term so far (:func:`spherepde.diffusion.heat_flow`); (0, 0.0) without noise."""
        d = self._diffusion
        return (0, 0.0) if d is None else (d.n_clipped, d.clipped_mass)

    @property
    def last_dt(self) -> float | None:
        """The size of the last accepted step (None before the first)."""
        return self.diag["dt"][-1] if self.diag["dt"] else None

    @property
    def n_rejected(self) -> int:
        """Rejected step attempts so far."""
        return int(sum(self.diag["rejected"]))

    def log_progress(self, logger=log):
        """One INFO line: time, steps, the last step size and the rejected attempts."""
        logger.info("t = %.6g: %d steps (last dt %.3e), %d rejected", self.t, self.n_steps,
                    self.last_dt or 0.0, self.n_rejected)

    # ------------------------------------------------------------------ state (resume)
    def diagnostics(self) -> dict:
        d = {k: np.array(v) for k, v in self.diag.items()}
        for k in _STEP_KEYS:
            d[k] = np.append(d[k], 0.0)
        t = d["time"]
        integral = np.concatenate([[0.0], np.cumsum(0.5 * np.diff(t) * (d["sup_div"][1:] + d["sup_div"][:-1]))])
        d["gronwall"] = self.l0 * np.exp(-integral)
        return d

    def get_state(self) -> dict:
        """Everything needed to continue the run bit-for-bit (see :meth:`set_state`)."""
        return {
            "t": self.t,
            "f": self.f.copy(),
            "n_steps": self.n_steps,
            "n_regrids": self.n_regrids,
            "grid": getattr(self.grid, "cells_state", dict)(),  # {} for a fixed grid; adaptive: its cells (NUNIQ)
            "l0": self.l0,
            "diag": {k: list(v) for k, v in self.diag.items()},
            "history": [(t, a.copy()) for t, a, _ in self._history],
            # the heads' means of each history entry (moved across regrids); absent in older checkpoints
            "history_means": [[m.copy() for m in ms] if ms is not None else None for _, _, ms in self._history],
            "controller": {"dt_next": self._dt_next, "field_curv": self._field_curv,
                           "field_step": self._field_step, "field_err": self._field_err,
                           "history_moved": float(self._history_moved), "cfl_since_regrid": self._cfl_since_regrid,
                           # the node times of field_time="interpolate" (their weights are re-evaluated)
                           "node_h": self._node_h, "node_count": len(self._nodes),
                           **{f"node_t{k}": tk for k, tk in enumerate(self._nodes)},
                           **{f"node_err{k}": e for k, e in enumerate(self._node_errs)},
                           **{"model." + k: v for k, v in self._model_before.items()}},
        }

    def set_state(self, state: dict):
        """Restore a :meth:`get_state`; ValueError for a state that is not one of this grid (shape, finite,
        >= 0, the mass its diagnostics recorded), e.g. read from a damaged checkpoint."""
        if state.get("grid"):  # the cells the run had reached (a grid that adapts)
            self._set_grid(self.grid.with_cells(state["grid"]))
        self.n_regrids = int(state.get("n_regrids", 0))
        f = np.array(state["f"], dtype=float)
        if f.shape != (self.grid.n_cells,) or not np.all(np.isfinite(f)) or f.min() < 0.0:
            raise ValueError("the state's density is not one of this grid (shape, finite, >= 0)")
        mass = state["diag"].get("mass", [])
        if not mass or abs(self.grid.mass(f) - mass[-1]) > 1e-12 * max(1.0, abs(mass[-1])):
            raise ValueError("the state's density does not carry the mass its diagnostics recorded")
        self.t = float(state["t"])
        self.f = f
        self.n_steps = int(state["n_steps"])
        self.l0 = float(state["l0"])
        self.diag = {k: list(v) for k, v in state["diag"].items()}
        hist = state.get("history", [])
        means = state.get("history_means") or [None] * len(hist)
        self._history = [(float(t), np.array(a), None if ms is None else [np.array(m) for m in ms])
                         for (t, a), ms in zip(hist, means)]
        for k in _DIAG_KEYS:  # a key the checkpoint's version did not record: NaN for its steps (unknown)
            self.diag.setdefault(k, [float("nan")] * len(self.diag.get("dt", [])) if k in _STEP_KEYS else [])
        self._step_bound = 0.0  # the evaluations of this state (below) count for the next step, as in the run
        ctl = state.get("controller", {})
        self._dt_next = float(ctl.get("dt_next", np.inf))
        self._field_curv = float(ctl.get("field_curv", np.inf))
        self._field_step = int(ctl.get("field_step", self.n_steps))
        self._field_err = float(ctl.get("field_err", 0.0))
        self._history_moved = bool(ctl.get("history_moved", 0.0))
        # (a checkpoint of before the count: the steps since the last regrid of the old rule, n_steps % every)
        every = self._regrid_every
        self._cfl_since_regrid = float(ctl.get("cfl_since_regrid", self.n_steps % every if every > 0 else 0))
        n_nodes = int(ctl.get("node_count", 0))
        self._nodes = [float(ctl[f"node_t{k}"]) for k in range(n_nodes)]
        self._node_errs = [float(ctl[f"node_err{k}"]) for k in range(n_nodes)]
        self._node_h, self._node_a = float(ctl.get("node_h", np.nan)), {}
        self._set_model_state({k[6:]: v for k, v in ctl.items() if k.startswith("model.")})
        self._activate(self.t, reset=False)  # the restored history belongs to the layer in force at t
        self._mom = self._state_moments()  # as the uninterrupted run computed them (see _state_moments)


def solve(grid, model, f0, t_end: float, save_at=None, options: Options | None = None, *,
          progress=False, callback: Callable | None = None, **option_kwargs) -> Result:
    """Solve d_t f + div_S(f v) = 0 on ``grid`` from ``f0`` to ``t_end``.

    Parameters
    ----------
    grid : a spherepde grid (e.g. ``HealpixGrid(nside)``).
    model : a spherepde model (``ZeroTemperature``, ``Attention``, ``Prescribed``).
    f0 : callable ``f0(x) -> (n,)`` (cell-averaged by quadrature) or cell averages of shape (N,).
        Must be finite, >= 0, with positive mass (it is not renormalised). A callable may declare narrow
        features as an attribute ``f0.features = [(point, width), ...]`` (a vMF mean and 1 / sqrt(kappa)):
        they are then integrated adaptively, and an adaptive grid refines on them before the run.
    t_end : float >= 0.
    save_at : sequence of times in [0, t_end], strictly increasing; default (0, t_end). The step size
        is shortened to land exactly on each.
    options : :class:`Options`; keyword arguments (``cfl=0.3, stepper="ssprk3"``, ...) may be given
        instead and override its fields.
    progress : bool
        Show a progress bar with ETA (tqdm, in simulated time): on stderr when it is a terminal, and in a
        Jupyter notebook (tqdm's widget when ipywidgets is installed).
    callback : callable(solver), optional
        Called after every step (checkpointing, custom diagnostics).

    Returns
    -------
    Result
    """
    options = Options() if options is None else options
    if option_kwargs:
        options = replace(options, **option_kwargs)
    t_end = finite_float(t_end, "t_end", low=0.0)
    save = _save_times(save_at, 0.0, t_end)
    start = _time.perf_counter()
    solver = Solver(grid, model, f0, options)
    solver.check_step_budget(t_end)
    saved = []
    bar = None
    if progress:
        from .progress import ProgressBar

        bar = ProgressBar(t_end)

    def _cb(s):
        if bar is not None:
            bar.update(s.t, s.last_dt)
        if callback is not None:
            callback(s)

    grids = []
    for ts in save:
        solver.advance(ts, _cb)
        saved.append(solver.f.copy())
        grids.append(solver.grid)
        solver.log_progress()
    solver.advance(t_end, _cb)
    if bar is not None:
        bar.close()
    wall = _time.perf_counter() - start
    log.info("solve: %d steps (%d rejected) to t = %g in %.2f s", solver.n_steps, solver.n_rejected, t_end, wall)
    fixed = all(g is grids[0] for g in grids)
    first = grids[0] if grids else solver.grid
    density = np.array(saved).reshape(len(save), first.n_cells) if fixed else saved
    return Result(times=save, density=density, diagnostics=solver.diagnostics(), grid=first, model=model,
                  options=options, n_steps=solver.n_steps, wall_time=wall, grids=None if fixed else grids)
