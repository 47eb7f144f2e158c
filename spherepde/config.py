"""Experiment configuration: a TOML file parsed into validated, frozen objects.

Functions
---------
load_config(path) -> ExperimentConfig
    Read and validate an experiment TOML file.
parse_config(source) -> ExperimentConfig
    Validate TOML text or an already-parsed dict.
dump_toml(data) -> str
    Write a plain dict (the subset of TOML the configs use) back to TOML text.

The objects build what they describe: ``cfg.build_grid()``, ``cfg.build_model()``,
``cfg.build_initial(grid)`` (cell averages), ``cfg.save_times()``, ``cfg.options()``
(:class:`spherepde.solver.Options`). Every error is a :class:`ConfigError` that names the key (dotted,
e.g. ``model.beta``), the value found and what is allowed; unknown sections and keys are errors.

Sections (see ``docs/user_guide.md`` and ``docs/examples/*.toml``)::

    name = "..."  description = "..."              # optional, top level
    [grid]      type = "healpix" (nside, edge_points) | "tensor" (d, n)
                     | "adaptive" (nside_min, nside_max, edge_points, max_cells, refine, variation, attention,
                       floor, coarsen, buffer, regrid_interval, attended, attended_floor,
                       attention_variation)
    [model]     type = "zero_temperature" (B, V) | "attention" (B, V, beta, tol, method; beta = inf is
                     the zero-temperature limit)
                     | "prescribed_rotation" (axis, omega) | "prescribed_linear" (M)
    [initial]   type = "uniform" | "vmf_mixture" (means, kappas, weights, uniform_weight)
                     | "perturbed_uniform" (eps) | "quadratic" (Q, b); sample = "average" | "center"
    [time]      t_end, and save_every or save_at
    [scheme]    scheme, limiter, stepper, cfl, field_interval, field_time, max_steps  -> spherepde.solver.Options
    [output]    checkpoint_every (seconds), fits, plots, diagnostics_p
    [particles] n, seed, dt, method, hardmax   (optional overlay run)

Matrices (B, V, M) are nested lists (rows), a flat list (the diagonal), or a preset name from
:data:`MATRIX_PRESETS` ("paper" gives the paper's B = diag(-1, -1, 1), V = diag(-1, 1, -2)).
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

__all__ = [
    "ConfigError", "ExperimentConfig", "GridConfig", "ModelConfig", "InitialConfig", "TimeConfig",
    "SchemeConfig", "OutputConfig", "ParticlesConfig", "load_config", "parse_config", "dump_toml",
    "MATRIX_PRESETS", "PLOTS", "perturbed_uniform",
]


class ConfigError(ValueError):
    """An invalid experiment configuration; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}': got {value!r}; allowed: {allowed}")


#: Named matrices: name -> {"B": ..., "V": ..., "M": ...} (d = 3 unless stated by the diagonal length).
MATRIX_PRESETS = {
    "paper": {"B": np.diag([-1.0, -1.0, 1.0]), "V": np.diag([-1.0, 1.0, -2.0])},
    "identity": {"B": np.eye(3), "V": np.eye(3), "M": np.eye(3)},
    # a general invertible pair with non-symmetric V B^T (the convergence studies' second case)
    "general": {"B": np.eye(3) + 0.3 * np.array([[0, 1, 0.5], [-0.2, 0, 1], [0.4, -0.3, 0]]),
                "V": np.array([[0.2, 1.0, 0.3], [-0.8, 0.1, 0.5], [0.3, -0.4, -0.6]])},
}

#: Figure kinds the runner and ``spherepde plot`` know.
PLOTS = ("maps", "diagnostics", "concentration", "animation", "particles")

#: Most saved frames of a run (t_end / save_every), and the largest vMF concentration of an initial density.
MAX_FRAMES = 1e6
MAX_KAPPA = 1e10

GRID_TYPES = ("healpix", "tensor", "adaptive")
#: The refinement keys of an adaptive [grid] -> the field of spherepde.grids.adaptive.Refinement.
REFINEMENT_KEYS = {"variation": "variation", "attention": "attention", "floor": "floor", "coarsen": "coarsen",
                   "buffer": "buffer", "regrid_interval": "interval", "attended": "attended",
                   "attended_floor": "attended_floor", "attention_variation": "attention_variation"}
MODEL_TYPES = ("zero_temperature", "attention", "prescribed_rotation", "prescribed_linear", "feedforward",
               "multihead", "sum", "layers", "noise")
#: The activations of a feed-forward term (spherepde.models.terms.ACTIVATIONS).
ACTIVATION_NAMES = ("relu", "gelu", "tanh", "sigmoid", "identity")
INITIAL_TYPES = ("uniform", "vmf_mixture", "perturbed_uniform", "quadratic")
INITIAL_SAMPLES = ("average", "center")
ATTENTION_METHODS = ("auto", "direct", "pruned", "spectral")


# ----------------------------------------------------------------------------------------- checkers
def _check_keys(section: dict, allowed: tuple, where: str):
    for k in section:
        if k not in allowed:
            raise ConfigError(f"{where}.{k}" if where else k, section[k],
                              f"known keys of [{where or 'top level'}] are {', '.join(allowed)} (unknown key)")


def _int(sec, key, where, default=None, minimum=None, maximum=None, required=False):
    if key not in sec:
        if required:
            raise ConfigError(f"{where}.{key}", None, "an integer (required)")
        return default
    v = sec[key]
    rng = _range_text(minimum, maximum)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}.{key}", v, f"an integer{rng}")
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ConfigError(f"{where}.{key}", v, f"an integer{rng}")
    return v


def _range_text(lo, hi, lo_open=False, hi_open=False):
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")
    return (" " + " and ".join(parts)) if parts else ""


def _float(sec, key, where, default=None, lo=None, hi=None, lo_open=False, hi_open=False, required=False):
    if key not in sec:
        if required:
            raise ConfigError(f"{where}.{key}", None, "a number (required)")
        return default
    v = sec[key]
    rng = _range_text(lo, hi, lo_open, hi_open)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where}.{key}", v, f"a finite number{rng}")
    v = float(v)
    bad = not math.isfinite(v)
    bad |= lo is not None and (v < lo or (lo_open and v == lo))
    bad |= hi is not None and (v > hi or (hi_open and v == hi))
    if bad:
        raise ConfigError(f"{where}.{key}", v, f"a finite number{rng}")
    return v


def _str(sec, key, where, choices, default=None):
    if key not in sec:
        if default is None:
            raise ConfigError(f"{where}.{key}", None, f"one of {', '.join(map(repr, choices))} (required)")
        return default
    v = sec[key]
    if not isinstance(v, str) or v not in choices:
        raise ConfigError(f"{where}.{key}", v, f"one of {', '.join(map(repr, choices))}")
    return v


def _bool(sec, key, where, default):
    v = sec.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{where}.{key}", v, "true or false")
    return v


def _matrix(sec, key, where, preset_key=None, required=True):
    """A square matrix from nested lists, a flat diagonal list, or a preset name; returned as lists."""
    if key not in sec:
        if required:
            raise ConfigError(f"{where}.{key}", None, "a matrix (nested lists, a diagonal list or a preset name)")
        return None
    v = sec[key]
    presets = [n for n, p in MATRIX_PRESETS.items() if (preset_key or key) in p]
    allowed = (f"a square d x d matrix as nested lists of numbers (rows), a flat list (its diagonal), "
               f"or a preset name: {', '.join(map(repr, presets))}")
    if isinstance(v, str):
        if v not in presets:
            raise ConfigError(f"{where}.{key}", v, allowed)
        return MATRIX_PRESETS[v][preset_key or key].tolist()
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}.{key}", v, allowed)
    if all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in v):
        a = np.diag(np.array(v, dtype=float))
    elif all(isinstance(r, list) for r in v):
        if any(len(r) != len(v) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r)
               for r in v):
            raise ConfigError(f"{where}.{key}", v, allowed)
        a = np.array(v, dtype=float)
    else:
        raise ConfigError(f"{where}.{key}", v, allowed)
    if a.shape[0] < 2 or not np.all(np.isfinite(a)):
        raise ConfigError(f"{where}.{key}", v, allowed + " (d >= 2, finite entries)")
    return a.tolist()


def _check_invertible(sec, B, where, what):
    cond = float(np.linalg.cond(np.array(B)))
    if not math.isfinite(cond) or cond > 1e12:
        raise ConfigError(f"{where}.B", sec["B"], f"an invertible matrix (condition number <= 1e12) {what}; "
                          f"this one has {cond:.3e}")


def _number_rows(v) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(r, list) and r and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r)
        for r in v)


def _rect(sec, key, where, shape=None):
    """A finite rectangular matrix (nested lists, rows), of ``shape`` when given; returned as lists."""
    v = sec.get(key)
    want = f"a {shape[0]} x {shape[1]} matrix" if shape else "a matrix"
    allowed = f"{want} as nested lists of finite numbers (rows of equal length)"
    if not _number_rows(v) or len({len(r) for r in v}) != 1:
        raise ConfigError(f"{where}.{key}", v, allowed + (" (required)" if v is None else ""))
    a = np.array(v, dtype=float)
    if not np.all(np.isfinite(a)) or (shape is not None and a.shape != tuple(shape)):
        raise ConfigError(f"{where}.{key}", v, allowed)
    return a.tolist()


def _vec(sec, key, where, n):
    """A finite vector of length n; returned as a list."""
    v = sec.get(key)
    ok = isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    for x in v)
    if not ok or not all(math.isfinite(float(x)) for x in v):
        raise ConfigError(f"{where}.{key}", v, f"a list of {n} finite numbers" + (" (required)" if v is None else ""))
    return [float(x) for x in v]


def _vector_list(sec, key, where, d=None, required=True):
    """A list of vectors (nested list) or one vector."""
    if key not in sec:
        if required:
            raise ConfigError(f"{where}.{key}", None, "a list of vectors (required)")
        return None
    v = sec[key]
    allowed = "a list of nonzero vectors" + (f" of length {d}" if d else "") + ", e.g. [[1, 0, 0], [-1, 0, 0]]"
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(r, list) for r in v):
        raise ConfigError(f"{where}.{key}", sec[key], allowed)
    try:
        a = np.array(v, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.{key}", sec[key], allowed) from None
    if a.ndim != 2 or (d is not None and a.shape[1] != d) or not np.all(np.isfinite(a)) \
            or np.any(np.linalg.norm(a, axis=1) == 0):
        raise ConfigError(f"{where}.{key}", sec[key], allowed)
    return a.tolist()


def _number_list(sec, key, where, n, default=None, lo=0.0, what="numbers"):
    if key not in sec:
        return default
    v = sec[key]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * n
    allowed = f"a number or a list of {n} {what} >= {lo}"
    if not isinstance(v, list) or len(v) != n or \
            not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= lo
                    for x in v):
        raise ConfigError(f"{where}.{key}", sec[key], allowed)
    return [float(x) for x in v]


# ----------------------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class GridConfig:
    """``[grid]``: ``type = "healpix"`` (``nside`` >= 1, ``edge_points``), ``"tensor"`` (``d`` in 2..4, ``n``) or
    ``"adaptive"``: an :class:`~spherepde.grids.adaptive.AdaptiveHealpixGrid` of cells between ``nside_min``
    and ``nside_max`` (powers of 2, ``nside_min <= nside_max <= 2^20``), refined on the initial density
    before the run and regridded during it.

    Adaptive keys (defaults those of :class:`~spherepde.grids.adaptive.Refinement`): ``max_cells``
    (an error, naming it, when refinement would exceed it), ``refine`` (true; false keeps the
    ``nside_min`` cells all run), ``variation`` (0.25), ``attention`` (0.5), ``floor`` (1e-4), ``coarsen``
    (0.25), ``buffer`` (2 rings), ``regrid_interval`` (4 CFL steps; shorter steps count as their fraction of
    one), ``attended`` (false: true counts the attention a cell receives as well as its density),
    ``attended_floor`` (= ``floor``: the attention density, relative to max f, from which ``attended`` counts a
    cell), ``attention_variation`` (0: the attention criterion only where f varies by more than it over a
    cell's stencil), ``edge_points`` (6).
    """

    type: str = "healpix"
    nside: int | None = None
    edge_points: int | None = None
    d: int | None = None
    n: int | None = None
    nside_min: int | None = None
    nside_max: int | None = None
    max_cells: int | None = None
    refine: bool | None = None
    variation: float | None = None
    attention: float | None = None
    floor: float | None = None
    coarsen: float | None = None
    buffer: int | None = None
    regrid_interval: int | None = None
    attended: bool | None = None
    attended_floor: float | None = None
    attention_variation: float | None = None

    @property
    def dim(self) -> int:
        return 3 if self.type in ("healpix", "adaptive") else int(self.d)

    @classmethod
    def parse(cls, sec: dict) -> "GridConfig":
        w = "grid"
        t = _str(sec, "type", w, GRID_TYPES)
        if t == "healpix":
            _check_keys(sec, ("type", "nside", "edge_points"), w)
            return cls(t, nside=_int(sec, "nside", w, minimum=1, required=True),
                       edge_points=_int(sec, "edge_points", w, minimum=1))
        if t == "adaptive":
            _check_keys(sec, ("type", "nside_min", "nside_max", "edge_points", "max_cells", "refine")
                        + tuple(REFINEMENT_KEYS), w)
            kw = {}
            for key in ("nside_min", "nside_max"):
                v = _int(sec, key, w, minimum=1, maximum=1 << 20, required=True)
                if v & (v - 1):
                    raise ConfigError(f"{w}.{key}", v, "a power of 2 (1, 2, 4, ..., 2^20)")
                kw[key] = v
            if kw["nside_max"] < kw["nside_min"]:
                raise ConfigError(f"{w}.nside_max", kw["nside_max"], f"a power of 2 >= grid.nside_min = {kw['nside_min']}")
            kw["edge_points"] = _int(sec, "edge_points", w, minimum=1)
            kw["max_cells"] = _int(sec, "max_cells", w, minimum=12 * kw["nside_min"] ** 2)
            kw["refine"] = _bool(sec, "refine", w, True) if "refine" in sec else None
            for key in ("variation", "attention", "floor", "attended_floor", "attention_variation"):
                kw[key] = _float(sec, key, w, lo=0.0, lo_open=key == "variation")
            kw["coarsen"] = _float(sec, "coarsen", w, lo=0.0, hi=1.0, hi_open=True)
            kw["buffer"] = _int(sec, "buffer", w, minimum=0)
            kw["regrid_interval"] = _int(sec, "regrid_interval", w, minimum=1)
            kw["attended"] = _bool(sec, "attended", w, False) if "attended" in sec else None
            return cls(t, **kw)
        _check_keys(sec, ("type", "d", "n"), w)
        return cls(t, d=_int(sec, "d", w, minimum=2, maximum=4, required=True),
                   n=_int(sec, "n", w, minimum=1, required=True))

    def refinement(self):
        """The :class:`~spherepde.grids.adaptive.Refinement` of an adaptive grid (False: ``refine = false``)."""
        from .grids.adaptive import Refinement

        if self.refine is False:
            return False
        return Refinement(**{field_: getattr(self, key) for key, field_ in REFINEMENT_KEYS.items()
                             if getattr(self, key) is not None})

    def build(self):
        kw = {} if self.edge_points is None else {"edge_points": self.edge_points}
        if self.type == "healpix":
            from .grids.healpix import HealpixGrid

            return HealpixGrid(self.nside, **kw)
        if self.type == "adaptive":
            from .grids.adaptive import AdaptiveHealpixGrid

            return AdaptiveHealpixGrid(self.nside_min, self.nside_max, refinement=self.refinement(),
                                       max_cells=self.max_cells, **kw)
        try:
            from .grids.tensor import TensorGrid
        except ImportError as exc:  # the tensor grids are another issue's work
            raise ConfigError("grid.type", "tensor", "'healpix' (spherepde.grids.tensor is not available: "
                              f"{exc})") from None
        return TensorGrid(self.d, self.n)


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the velocity model; matrices are stored as lists of rows.

    ``type = "attention"`` with ``beta = inf`` builds the zero-temperature (hardmax) limit
    :class:`~spherepde.models.ZeroTemperature` (``tol`` and ``method`` unused), so that a scan over beta
    can include it."""

    type: str
    B: list | None = None
    V: list | None = None
    beta: float | None = None
    tol: float | None = None
    method: str | None = None
    axis: list | None = None
    omega: float | None = None
    M: list | None = None
    W1: list | None = None
    b1: list | None = None
    W2: list | None = None
    b2: list | None = None
    activation: str | None = None
    heads: tuple | None = None  # multihead: ModelConfig of type attention, one per head
    weights: list | None = None  # multihead: the head weights (default 1 / H)
    terms: tuple | None = None  # sum: ModelConfig, one per term
    layers: tuple | None = None  # layers: (t_start, ModelConfig) pairs
    normalization: str | None = None  # attention: "softmax" | "usa"
    sigma: float | None = None  # noise
    d: int | None = None  # noise on its own: d of S^(d-1) (in a sum it takes the other terms' d)

    @property
    def dim(self) -> int:
        if self.type == "prescribed_rotation":
            return 3
        if self.type == "feedforward":
            return len(self.W2)
        if self.type == "noise":
            return self.d or 3
        if self.type == "sum":
            dims = [m.dim for m in self.terms if m.type != "noise"]
            return dims[0] if dims else self.terms[0].dim
        if self.type in ("multihead", "sum"):
            return (self.heads or self.terms)[0].dim
        if self.type == "layers":
            return self.layers[0][1].dim
        return len(self.M if self.type == "prescribed_linear" else self.B)

    def to_dict(self) -> dict:
        """The section as plain data (nested models as tables, None left out): what TOML writes."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name in ("heads", "terms"):
                v = [m.to_dict() for m in v]
            elif f.name == "layers":
                v = [{"t_start": t, **m.to_dict()} for t, m in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def parse(cls, sec: dict, w: str = "model") -> "ModelConfig":
        if not isinstance(sec, dict):
            raise ConfigError(w, sec, "a table of the model's keys (type = ..., ...)")
        t = _str(sec, "type", w, MODEL_TYPES)
        if t == "noise":
            _check_keys(sec, ("type", "sigma", "d"), w)
            return cls(t, sigma=_float(sec, "sigma", w, lo=0.0, required=True),
                       d=_int(sec, "d", w, default=None, minimum=2))
        if t == "feedforward":
            _check_keys(sec, ("type", "W1", "b1", "W2", "b2", "activation"), w)
            W1 = _rect(sec, "W1", w)
            m, d = len(W1), len(W1[0])
            W2 = _rect(sec, "W2", w, shape=(d, m))
            b1 = _vec(sec, "b1", w, m)
            b2 = _vec(sec, "b2", w, d)
            act = _str(sec, "activation", w, ACTIVATION_NAMES, default="relu")
            return cls(t, W1=W1, b1=b1, W2=W2, b2=b2, activation=act)
        if t in ("multihead", "sum"):
            key = "heads" if t == "multihead" else "terms"
            _check_keys(sec, ("type", key) + (("weights",) if t == "multihead" else ()), w)
            items = sec.get(key)
            if not isinstance(items, list) or not items:
                raise ConfigError(f"{w}.{key}", items, f"a non-empty list of model tables ([[{w}.{key}]])")
            parts = tuple(cls.parse(x, f"{w}.{key}[{i}]") for i, x in enumerate(items))
            if t == "multihead":
                bad = [i for i, p in enumerate(parts) if p.type != "attention" or p.beta == math.inf]
                if bad:
                    raise ConfigError(f"{w}.heads[{bad[0]}].type", items[bad[0]].get("type"),
                                      "'attention' with a finite beta (every head is an attention head)")
            dims = {p.dim for p in parts if p.type != "noise"} or {parts[0].dim}
            if len(dims) != 1:
                raise ConfigError(f"{w}.{key}", f"dimensions {sorted(dims)}", "parts of one dimension d")
            weights = None
            if t == "multihead" and "weights" in sec:
                weights = _vec(sec, "weights", w, len(parts))
            return cls(t, heads=parts, weights=weights) if t == "multihead" else cls(t, terms=parts)
        if t == "layers":
            _check_keys(sec, ("type", "layers"), w)
            items = sec.get("layers")
            if not isinstance(items, list) or not items or not all(isinstance(x, dict) for x in items):
                raise ConfigError(f"{w}.layers", items, "a non-empty list of tables [[model.layers]] with "
                                  "t_start and the keys of a model")
            layers = []
            for i, x in enumerate(items):
                wi = f"{w}.layers[{i}]"
                t0 = _float(x, "t_start", wi, lo=0.0, required=True)
                if x.get("type") == "layers":
                    raise ConfigError(f"{wi}.type", "layers", "a model other than layers (no nesting)")
                layers.append((t0, cls.parse({k: v for k, v in x.items() if k != "t_start"}, wi)))
            starts = [t0 for t0, _ in layers]
            if starts[0] != 0.0 or any(b <= a for a, b in zip(starts, starts[1:])):
                raise ConfigError(f"{w}.layers", starts, "t_start values strictly increasing from 0")
            if len({m.dim for _, m in layers}) != 1:
                raise ConfigError(f"{w}.layers", "mixed dimensions", "layers of one dimension d")
            return cls(t, layers=tuple(layers))
        if t in ("zero_temperature", "attention"):
            keys = ("type", "B", "V") + (("beta", "tol", "method", "normalization") if t == "attention" else ())
            _check_keys(sec, keys, w)
            B = _matrix(sec, "B", w)
            V = _matrix(sec, "V", w)
            if len(V) != len(B):
                raise ConfigError(f"{w}.V", sec["V"], f"a {len(B)} x {len(B)} matrix (the size of model.B)")
            if t == "zero_temperature":
                _check_invertible(sec, B, w, "for the zero-temperature model")
                return cls(t, B=B, V=V)
            if sec.get("beta") == math.inf:  # the zero-temperature limit (hardmax attention)
                _check_invertible(sec, B, w, "for beta = inf (the zero-temperature limit)")
                beta = math.inf
            else:
                beta = _float(sec, "beta", w, lo=0.0, required=True)
            tol = _float(sec, "tol", w, default=1e-12, lo=0.0, hi=0.1, lo_open=True)
            method = _str(sec, "method", w, ATTENTION_METHODS, default="auto")
            norm = _str(sec, "normalization", w, ("softmax", "usa"), default="softmax")
            if norm == "usa" and beta == math.inf:
                raise ConfigError(f"{w}.beta", beta, "a finite number >= 0 for normalization = 'usa'")
            # the default is left out of the record (None), so existing configurations keep their fingerprints
            return cls(t, B=B, V=V, beta=beta, tol=tol, method=method, normalization=None if norm == "softmax" else norm)
        if t == "prescribed_rotation":
            _check_keys(sec, ("type", "axis", "omega"), w)
            axis = _vector_list(sec, "axis", w, d=3)
            if len(axis) != 1:
                raise ConfigError(f"{w}.axis", sec["axis"], "one nonzero 3-vector, e.g. [0, 0, 1]")
            return cls(t, axis=axis[0], omega=_float(sec, "omega", w, default=1.0))
        _check_keys(sec, ("type", "M"), w)
        return cls(t, M=_matrix(sec, "M", w))

    def build(self):
        from .models import terms as _terms

        if self.type == "noise":
            return _terms.Noise(self.sigma, self.d or 3)
        if self.type == "feedforward":
            return _terms.FeedForward(np.array(self.W1), np.array(self.b1), np.array(self.W2), np.array(self.b2),
                                      self.activation)
        if self.type == "multihead":
            return _terms.MultiHead([h.build() for h in self.heads], weights=self.weights)
        if self.type == "sum":
            return _terms.Sum([m.build() for m in self.terms])
        if self.type == "layers":
            return _terms.Layers([(t0, m.build()) for t0, m in self.layers])
        if self.type == "zero_temperature":
            from .models import ZeroTemperature

            return ZeroTemperature(np.array(self.B), np.array(self.V))
        if self.type == "attention" and self.beta == math.inf:
            from .models import ZeroTemperature

            return ZeroTemperature(np.array(self.B), np.array(self.V))
        if self.type == "attention":
            from .models.attention import Attention

            return Attention(np.array(self.B), np.array(self.V), beta=self.beta, tol=self.tol, method=self.method,
                             normalization=self.normalization or "softmax")
        from .models import Prescribed

        if self.type == "prescribed_rotation":
            return Prescribed.rigid_rotation(self.axis, self.omega)
        return Prescribed.linear(np.array(self.M))


def _sphere_area(d: int) -> float:
    return 2.0 * math.pi ** (d / 2) / math.gamma(d / 2)


def vmf_density(x: np.ndarray, mean, kappa: float) -> np.ndarray:
    r"""Normalised von Mises-Fisher density C_d(kappa) exp(kappa <mu, x>) on S^(d-1), overflow-free.

    Notes
    -----
    C_d(kappa) = kappa^{d/2-1} / ((2 pi)^{d/2} I_{d/2-1}(kappa)); with the scaled Bessel function
    ``ive`` the density is kappa^{d/2-1} exp(-kappa (1 - <mu, x>)) / ((2 pi)^{d/2} ive(d/2 - 1, kappa)).
    Near the mean 1 - <mu, x> is computed as |x - mu|^2 / 2 (no cancellation: kappa times the
    round-off of 1 - <mu, x> would be a relative error of 1e-11 at kappa = 1e5); on S^2 the constant is
    kappa / (2 pi (1 - exp(-2 kappa))) exactly, and for other d beyond ``ive``'s range (kappa ~ 1e10)
    its asymptotic series.
    """
    x = np.asarray(x, float)
    d = x.shape[1]
    mu = np.asarray(mean, float)
    mu = mu / np.linalg.norm(mu)
    if kappa == 0:
        return np.full(x.shape[0], 1.0 / _sphere_area(d))
    c = _vmf_constant(d, float(kappa))
    cos = x @ mu
    diff = x - mu
    gap = np.where(cos > 0.5, 0.5 * np.einsum("ij,ij->i", diff, diff), 1.0 - cos)
    return c * np.exp(-kappa * gap)


def _vmf_constant(d: int, kappa: float) -> float:
    """C_d(kappa) e^kappa, the vMF normalisation times e^kappa (so that density = this exp(-kappa (1 - cos)))."""
    from scipy.special import ive

    if d == 3:
        return kappa / (2 * math.pi * -math.expm1(-2.0 * kappa))
    nu = d / 2 - 1
    iv = float(ive(nu, kappa))
    if not (math.isfinite(iv) and iv > 0):  # ive gives NaN near 1e10: I_nu(k) e^-k ~ (1 - (4 nu^2 - 1) / (8 k)) / sqrt(2 pi k)
        m = 4 * nu * nu
        iv = (1 - (m - 1) / (8 * kappa) + (m - 1) * (m - 9) / (2 * (8 * kappa) ** 2)) / math.sqrt(2 * math.pi * kappa)
    return kappa ** nu / ((2 * math.pi) ** (d / 2) * iv)


def perturbed_uniform(x, eps: float = 0.05) -> np.ndarray:
    """The 5 % perturbed uniform density of the paper's studies on S^2 (fig3, fig4, appendix C):
    (1 + eps (x_1 x_2 + x_2 + x_3 x_1 / 2)) / (4 pi), which breaks the reflection symmetries x_i -> -x_i of
    the uniform density (whose solution then keeps them, and never leaves E). Mass 1 exactly, positive for
    eps < 2/3."""
    x = np.asarray(x, float)
    return (1.0 + eps * (x[:, 0] * x[:, 1] + x[:, 1] + 0.5 * x[:, 2] * x[:, 0])) / (4 * np.pi)


@dataclass(frozen=True)
class InitialConfig:
    """``[initial]``: ``type = "uniform"``, ``"vmf_mixture"`` or ``"perturbed_uniform"``.

    ``vmf_mixture``: f0 = uniform_weight / |S^(d-1)| + (1 - uniform_weight) sum_c w_c vMF(means_c, kappas_c)
    (a probability density; ``uniform_weight`` > 0 keeps it bounded below, as the minimal-density lemma
    assumes). ``weights`` default equal; they are normalised to sum 1.

    ``perturbed_uniform`` (d = 3): :func:`perturbed_uniform` with ``eps`` in [0, 2/3) (default 0.05).

    ``quadratic``: the uniform density times a polynomial of degree 2,
    f0 = (1 + x^T Q x - tr(Q)/d + b . x) / |S^(d-1)| (``Q`` a d x d matrix, used symmetrised, default 0;
    ``b`` a d-vector, default 0): a probability density exactly (int x_i x_j = delta_ij |S|/d), refused
    unless 1 - tr(Q)/d + lambda_min(Q) - |b| > 0, a bound that keeps it positive. E.g. the minimal-density
    study's (1 + 0.3 x1 x2) / (4 pi) is ``Q = [[0, 0.15, 0], [0.15, 0, 0], [0, 0, 0]]``.

    ``sample``: ``"average"`` (default) takes cell averages of f0 by the grid's quadrature (exact mass to
    the quadrature error); ``"center"`` takes the point values at the cell centres (what the paper's
    validation studies did: their records are reproduced bit for bit).
    """

    type: str = "uniform"
    means: list | None = None
    kappas: list | None = None
    weights: list | None = None
    uniform_weight: float | None = None
    eps: float | None = None
    Q: list | None = None
    b: list | None = None
    sample: str | None = None  # None: "average" (kept out of the record, so older runs' hashes hold)

    @classmethod
    def parse(cls, sec: dict, d: int) -> "InitialConfig":
        w = "initial"
        t = _str(sec, "type", w, INITIAL_TYPES, default="uniform")
        sample = _str(sec, "sample", w, INITIAL_SAMPLES, default="average")
        sample = None if sample == "average" else sample
        if t == "uniform":
            _check_keys(sec, ("type", "sample"), w)
            return cls(t, sample=sample)
        if t == "perturbed_uniform":
            _check_keys(sec, ("type", "eps", "sample"), w)
            if d != 3:
                raise ConfigError(f"{w}.type", t, "'uniform' or 'vmf_mixture' on S^%d (perturbed_uniform is "
                                  "defined on S^2, d = 3)" % (d - 1))
            eps = _float(sec, "eps", w, default=0.05, lo=0.0, hi=2.0 / 3.0, hi_open=True)
            return cls(t, eps=eps, sample=sample)
        if t == "quadratic":
            _check_keys(sec, ("type", "Q", "b", "sample"), w)
            Q = _matrix(sec, "Q", w, required=False)
            Q = np.zeros((d, d)) if Q is None else np.array(Q)
            if Q.shape != (d, d):
                raise ConfigError(f"{w}.Q", sec["Q"], f"a {d} x {d} matrix (the grid's dimension)")
            Q = 0.5 * (Q + Q.T)
            b = sec.get("b", [0.0] * d)
            if not (isinstance(b, list) and len(b) == d and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in b)):
                raise ConfigError(f"{w}.b", sec["b"], f"a vector of {d} finite numbers")
            b = np.array(b, dtype=float)
            margin = 1.0 - np.trace(Q) / d + float(np.linalg.eigvalsh(Q)[0]) - float(np.linalg.norm(b))
            if not margin > 0:
                raise ConfigError(f"{w}.Q", sec.get("Q"), "a perturbation that keeps f0 > 0: 1 - tr(Q)/d + "
                                  f"lambda_min(Q) - |b| > 0 (here {margin:.3g})")
            return cls(t, Q=Q.tolist(), b=b.tolist(), sample=sample)
        _check_keys(sec, ("type", "means", "kappas", "weights", "uniform_weight", "sample"), w)
        means = _vector_list(sec, "means", w, d=d)
        c = len(means)
        kappas = _number_list(sec, "kappas", w, c, what="concentrations")
        if kappas is None:
            raise ConfigError(f"{w}.kappas", None, f"a number or a list of {c} concentrations >= 0 (required)")
        if max(kappas) > MAX_KAPPA:
            raise ConfigError(f"{w}.kappas", sec["kappas"], f"concentrations <= {MAX_KAPPA:.0e} (a cap of angular width "
                              "1e-5 rad, far below any grid cell)")
        weights = _number_list(sec, "weights", w, c, default=[1.0] * c, what="weights")
        if sum(weights) <= 0:
            raise ConfigError(f"{w}.weights", sec["weights"], "weights >= 0 with a positive sum")
        uw = _float(sec, "uniform_weight", w, default=0.0, lo=0.0, hi=1.0)
        return cls(t, means=means, kappas=kappas, weights=[x / sum(weights) for x in weights], uniform_weight=uw,
                   sample=sample)

    def density(self, d: int):
        """The initial density as a function ``f0(x) -> (n,)`` on S^(d-1)."""
        area = _sphere_area(d)
        if self.type == "uniform":
            return lambda x: np.full(np.asarray(x).shape[0], 1.0 / area)
        if self.type == "perturbed_uniform":
            eps = self.eps
            return lambda x: perturbed_uniform(x, eps)
        if self.type == "quadratic":
            Q, b = np.array(self.Q), np.array(self.b)
            c = 1.0 - np.trace(Q) / d

            def fq(x):
                x = np.asarray(x, float)
                return (c + np.einsum("ni,ij,nj->n", x, Q, x) + x @ b) / area

            return fq
        comps = list(zip(self.means, self.kappas, self.weights))
        uw = self.uniform_weight or 0.0

        def f0(x):
            x = np.asarray(x, float)
            out = np.full(x.shape[0], uw / area)
            for mu, k, wt in comps:
                out += (1.0 - uw) * wt * vmf_density(x, mu, k)
            return out

        return f0

    def features(self) -> list:
        """(mean, width) of each vMF component with mass: width 1 / sqrt(kappa), its angular size."""
        if self.type != "vmf_mixture" or (self.uniform_weight or 0.0) >= 1.0:
            return []
        return [(i, mu, 1.0 / math.sqrt(k)) for i, (mu, k, wt) in enumerate(zip(self.means, self.kappas, self.weights))
                if k > 0 and wt > 0]

    def function(self, d: int):
        """The initial density as a callable ``f0(x)`` with its narrow vMF components declared as
        ``f0.features = [(mean, 1 / sqrt(kappa)), ...]``: what a grid that adapts refines on before the run
        (:meth:`spherepde.grids.base.Grid.initial`), and then averages adaptively on its cells."""
        dens = self.density(d)

        def f0(x):
            return dens(x)

        f0.features = [(list(mu), w) for _, mu, w in self.features()]
        return f0

    def build(self, grid) -> np.ndarray:
        """f0 on ``grid``: cell averages by grid quadrature (the uniform density exactly), or the values
        at the cell centres (``sample = "center"``).

        A vMF component narrower than ``NARROW_CELLS`` cell widths (1 / sqrt(kappa) < 2 h,
        h = sqrt(|S| / n_cells)) is averaged adaptively (``grid.cell_average(..., rtol=1e-13,
        features=...)``: the cells near its mean split into exact sub-cells until the peak is resolved),
        so that the mass is 1 to 1e-12 and the peak's cells hold their true share; a fixed rule there
        gives any mass (0.08 for kappa = 1e6 at nside 16). Broad densities keep the fixed rule (same
        values, same cost; its mass error is ~1e-9 at nside 8, 1e-11 at 16, far below the scheme's). ``sample = "center"`` with a narrow component, or a result whose mass is
        still off by more than 1e-12, warns (RuntimeWarning) with what to do.
        """
        if self.type == "uniform":
            return np.full(grid.n_cells, 1.0 / grid.total_area)
        f0 = self.density(grid.dim)
        h = math.sqrt(grid.total_area / grid.n_cells)
        feats = self.features()
        narrow = [(i, mu, w) for i, mu, w in feats if w < NARROW_CELLS * h]
        if self.sample == "center":
            vals = np.asarray(f0(grid.centers), dtype=float)
            if narrow:
                i, _, w = _narrowest(narrow)
                _warn(f"initial.kappas[{i}] = {self.kappas[i]:g}: the vMF width 1/sqrt(kappa) = {w:.3g} is below "
                      f"the cell width {h:.3g}, so values at the cell centres are not the density's cell averages "
                      f"(their mass is {grid.mass(vals):.6g}, not 1): use sample = \"average\" (the default, adaptive "
                      "quadrature) or a grid at least 1/width cells across")
            return vals
        tol = 1e-12 if narrow else 1e-6  # the fixed rule: ~1e-9 at nside 8, far below the scheme's error
        if not (narrow and hasattr(grid, "_sub_roots")):
            out = grid.cell_average(f0)
        else:
            out, info = grid.cell_average(f0, rtol=1e-13, features=[(mu, w) for _, mu, w in narrow], info=True)
            if not info["converged"]:
                i, _, w = _narrowest(narrow)
                _warn(f"initial.kappas[{i}] = {self.kappas[i]:g}: adaptive cell averages did not converge "
                      f"(estimated relative error {info['error']:.2g} after {info['pieces']} sub-cells): "
                      "raise the grid resolution or lower kappa")
        mass = grid.mass(out)
        if abs(mass - 1.0) > tol and feats:
            i, _, w = _narrowest(feats)
            _warn(f"initial: the cell averages have mass {mass:.15g}, not 1 (narrowest component "
                  f"initial.kappas[{i}] = {self.kappas[i]:g}, width {w:.3g}, cell width {h:.3g}): raise the grid "
                  "resolution")
        return out


#: A vMF component narrower than this many cell widths is cell-averaged adaptively (InitialConfig.build).
NARROW_CELLS = 2.0


def _narrowest(features):
    """The (index, mean, width) of the narrowest vMF component."""
    return min(features, key=lambda item: item[2])


def _warn(msg: str) -> None:
    import warnings

    warnings.warn(msg, RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class TimeConfig:
    """``[time]``: ``t_end`` >= 0 and at most one of ``save_every`` (> 0) or ``save_at`` (list); default
    saves at 0 and t_end."""

    t_end: float
    save_every: float | None = None
    save_at: list | None = None

    @classmethod
    def parse(cls, sec: dict) -> "TimeConfig":
        w = "time"
        _check_keys(sec, ("t_end", "save_every", "save_at"), w)
        t_end = _float(sec, "t_end", w, lo=0.0, required=True)
        every = _float(sec, "save_every", w, lo=0.0, lo_open=True)
        if every is not None and t_end / every > MAX_FRAMES:
            raise ConfigError(f"{w}.save_every", every, f"at most {MAX_FRAMES:.0e} saved frames: t_end / save_every = "
                              f"{t_end / every:.3g} (t_end = {t_end:g})")
        at = None
        if "save_at" in sec:
            if every is not None:
                raise ConfigError(f"{w}.save_at", sec["save_at"], "not both save_at and save_every")
            v = sec["save_at"]
            ok = isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) for x in v)
            if ok:
                a = np.array(v, dtype=float)
                ok = bool(np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] <= t_end)
            if not ok:
                raise ConfigError(f"{w}.save_at", v, f"a strictly increasing list of times in [0, {t_end}]")
            at = [float(x) for x in v]
        return cls(t_end, every, at)

    def save_times(self) -> np.ndarray:
        if self.save_at is not None:
            return np.array(self.save_at, dtype=float)
        if self.save_every is None:
            return np.array([0.0, self.t_end]) if self.t_end > 0 else np.array([0.0])
        k = int(math.floor(self.t_end / self.save_every * (1 + 1e-12)))
        s = [i * self.save_every for i in range(k + 1)]
        if self.t_end - s[-1] > 1e-9 * max(1.0, self.t_end):
            s.append(self.t_end)
        s[-1] = min(s[-1], self.t_end)
        return np.array(s)


@dataclass(frozen=True)
class SchemeConfig:
    """``[scheme]``: the numerical options, one key per field of :class:`spherepde.solver.Options`
    (same names, same defaults but one; ``max_dt`` may be ``inf``; ``field_interval = 0`` is the default
    None, the field recomputed at every stage, so that a scan can switch it off).

    The one: ``field_time`` defaults to "exact" here, where ``Options`` defaults to "auto". It acts only on
    time-dependent fields given point-wise, and no configured model is one (its prescribed fields are
    steady, layer by layer: ``tests/test_config.py``), so it changes no configured run; but it is part of
    the configuration's JSON, which names a run's checkpoint and results file and a sweep member's
    directory, and "exact" is the value every configuration had before "auto": runs and sweep members of
    earlier versions resume as the same experiments."""

    scheme: str = "linear"
    limiter: str = "positivity"
    stepper: str = "auto"
    cfl: float = 0.4
    error_control: bool = True
    rtol: float = 1e-3
    atol: float = 1e-12
    max_dt: float = math.inf
    field_interval: int | None = None
    field_time: str = "exact"
    max_steps: int = 10**8

    @classmethod
    def parse(cls, sec: dict) -> "SchemeConfig":
        from .solver import FIELD_TIMES, LIMITERS, SCHEMES, STEPPERS

        w = "scheme"
        _check_keys(sec, tuple(f.name for f in fields(cls)), w)
        max_dt = sec.get("max_dt", math.inf)
        if max_dt != math.inf:
            max_dt = _float(sec, "max_dt", w, lo=0.0, lo_open=True)
        d = cls()
        return cls(
            scheme=_str(sec, "scheme", w, SCHEMES, default=d.scheme),
            limiter=_str(sec, "limiter", w, LIMITERS, default=d.limiter),
            stepper=_str(sec, "stepper", w, ("auto",) + tuple(STEPPERS), default=d.stepper),
            cfl=_float(sec, "cfl", w, default=d.cfl, lo=0.0, hi=1.0, lo_open=True),
            error_control=_bool(sec, "error_control", w, d.error_control),
            rtol=_float(sec, "rtol", w, default=d.rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
            atol=_float(sec, "atol", w, default=d.atol, lo=0.0),
            max_dt=max_dt,
            field_interval=_int(sec, "field_interval", w, minimum=0) or None,
            field_time=_str(sec, "field_time", w, FIELD_TIMES, default=d.field_time),
            max_steps=_int(sec, "max_steps", w, default=d.max_steps, minimum=1),
        )

    def options(self):
        from .solver import Options

        return Options(**asdict(self))


@dataclass(frozen=True)
class OutputConfig:
    """``[output]``: ``checkpoint_every`` (wall-clock seconds between checkpoints, besides one at every
    save time; default 60), ``fits`` (HEALPix FITS maps of every saved time), ``plots`` (a list from
    :data:`PLOTS`; default maps, diagnostics, concentration), ``diagnostics_p`` (exponent of V_p)."""

    checkpoint_every: float = 60.0
    fits: bool = False
    plots: tuple = ("maps", "diagnostics", "concentration")
    diagnostics_p: float = 0.25

    @classmethod
    def parse(cls, sec: dict) -> "OutputConfig":
        w = "output"
        _check_keys(sec, ("checkpoint_every", "fits", "plots", "diagnostics_p"), w)
        plots = sec.get("plots", list(cls.plots))
        if not isinstance(plots, list) or not all(isinstance(p, str) and p in PLOTS for p in plots):
            raise ConfigError(f"{w}.plots", plots, f"a list of names from {', '.join(map(repr, PLOTS))}")
        return cls(
            checkpoint_every=_float(sec, "checkpoint_every", w, default=60.0, lo=0.0),
            fits=_bool(sec, "fits", w, False),
            plots=tuple(plots),
            diagnostics_p=_float(sec, "diagnostics_p", w, default=0.25, lo=0.0, hi=1.0, lo_open=True),
        )


@dataclass(frozen=True)
class ParticlesConfig:
    """``[particles]`` (optional): an overlay particle run from tokens drawn from f0: ``n`` tokens,
    ``seed``, ``dt`` (default 0.01, as Algorithm 1), ``method`` ("euler" or "rk4"), ``hardmax``."""

    n: int = 200
    seed: int = 0
    dt: float = 0.01
    method: str = "euler"
    hardmax: bool = False

    @classmethod
    def parse(cls, sec: dict) -> "ParticlesConfig":
        w = "particles"
        _check_keys(sec, ("n", "seed", "dt", "method", "hardmax"), w)
        return cls(n=_int(sec, "n", w, default=200, minimum=1), seed=_int(sec, "seed", w, default=0, minimum=0),
                   dt=_float(sec, "dt", w, default=0.01, lo=0.0, lo_open=True),
                   method=_str(sec, "method", w, ("euler", "rk4"), default="euler"),
                   hardmax=_bool(sec, "hardmax", w, False))


SECTIONS = ("grid", "model", "initial", "time", "scheme", "output", "particles")
REQUIRED = ("grid", "model", "time")


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment. ``raw`` is the parsed dict and ``text`` the TOML it came from."""

    grid: GridConfig
    model: ModelConfig
    initial: InitialConfig
    time: TimeConfig
    scheme: SchemeConfig
    output: OutputConfig
    particles: ParticlesConfig | None
    name: str = "experiment"
    description: str = ""
    # The source as given (dict and TOML text) and the fingerprint (to_json) of what it parsed to. After
    # ``dataclasses.replace`` the objects no longer match the fingerprint, and ``raw`` / ``text`` are then
    # written from the objects: what a run computes with is what it records, by construction.
    source_raw: dict = field(default_factory=dict, repr=False, compare=False)
    source_text: str = field(default="", repr=False, compare=False)
    source_json: str = field(default="", repr=False, compare=False)

    def _source_matches(self) -> bool:
        return bool(self.source_json) and self.source_json == self.to_json()

    def validated(self) -> "ExperimentConfig":
        """This configuration when it is the one its source parsed to; else (changed with
        ``dataclasses.replace``) validated again from its objects (a ConfigError naming the key)."""
        return self if self._source_matches() else parse_config(self.to_dict())

    @property
    def raw(self) -> dict:
        """The configuration as a dict: the source's (comments and layout aside) when it still describes
        these objects, else :meth:`to_dict`."""
        return self.source_raw if self._source_matches() else self.to_dict()

    @property
    def text(self) -> str:
        """The configuration as TOML text: the source file's text (with its comments) when it still
        describes these objects (not after ``dataclasses.replace`` changed them), else written from them."""
        return self.source_text if self._source_matches() else dump_toml(self.to_dict())

    def build_grid(self):
        return self.grid.build()

    def build_model(self):
        return self.model.build()

    def build_initial(self, grid):
        """f0 on ``grid``: its cell averages (:meth:`InitialConfig.build`); on an adaptive grid
        (``[grid] type = "adaptive"``) the density function itself (:meth:`InitialConfig.function`), on
        which the solver refines the grid before it averages."""
        if self.grid.type == "adaptive":
            return self.initial.function(grid.dim)
        return self.initial.build(grid)

    def build_all(self):
        """(grid, model, f0) as a run builds them; a failure is a ConfigError naming the key or section
        (``spherepde run --check`` builds them too, so a config that passes the check can run)."""
        grid = _built(self.build_grid, "grid", self.raw.get("grid", {}))
        model = _built(self.build_model, "model", self.raw.get("model", {}))
        f0 = _built(lambda: self.build_initial(grid), "initial", self.raw.get("initial", {}))
        return grid, model, f0

    def save_times(self) -> np.ndarray:
        return self.time.save_times()

    def options(self):
        return self.scheme.options()

    def to_dict(self) -> dict:
        """The validated configuration with defaults filled in (JSON-serialisable)."""
        d = {"name": self.name, "description": self.description}
        for s in SECTIONS:
            obj = getattr(self, s)
            if obj is not None:
                d[s] = obj.to_dict() if hasattr(obj, "to_dict") else \
                    {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(obj).items() if v is not None}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def read_source(source, dump) -> tuple:
    """(dict, TOML text) of TOML text or a dict (whose text is ``dump(dict)``); bad TOML is a ConfigError."""
    if isinstance(source, str):
        try:
            return tomllib.loads(source), source
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("<toml>", str(exc), "valid TOML syntax") from None
    if isinstance(source, dict):
        return source, dump(source)
    raise TypeError(f"source must be TOML text or a dict, got {type(source).__name__}")


def parse_config(source) -> ExperimentConfig:
    """Validate an experiment given as TOML text or a dict (the output of ``tomllib.loads``).

    Raises
    ------
    ConfigError
        Naming the offending key (dotted), its value and what is allowed.
    """
    raw, text = read_source(source, dump_toml)
    for k, v in raw.items():
        if k in ("name", "description"):
            if not isinstance(v, str):
                raise ConfigError(k, v, "a string")
        elif k not in SECTIONS:
            raise ConfigError(k, v if not isinstance(v, dict) else f"[{k}]",
                              f"sections {', '.join(SECTIONS)} and the keys name, description (unknown key)")
        elif not isinstance(v, dict):
            raise ConfigError(k, v, f"a table [{k}]")
    for s in REQUIRED:
        if s not in raw:
            raise ConfigError(s, None, f"a [{s}] section (required)")
    grid = GridConfig.parse(raw["grid"])
    model = ModelConfig.parse(raw["model"])
    if model.dim != grid.dim:
        raise ConfigError("model", f"dimension {model.dim}", f"the grid's dimension d = {grid.dim} (matrix size)")
    initial = InitialConfig.parse(raw.get("initial", {}), grid.dim)
    if grid.type == "adaptive" and initial.sample == "center":
        raise ConfigError("initial.sample", "center", "'average' on an adaptive grid (its cells are refined on "
                          "f0 and averaged adaptively)")
    cfg = ExperimentConfig(
        grid=grid, model=model, initial=initial, time=TimeConfig.parse(raw["time"]),
        scheme=SchemeConfig.parse(raw.get("scheme", {})), output=OutputConfig.parse(raw.get("output", {})),
        particles=ParticlesConfig.parse(raw["particles"]) if "particles" in raw else None,
        name=raw.get("name", "experiment"), description=raw.get("description", ""), source_raw=raw,
        source_text=text,
    )
    cfg = replace(cfg, source_json=cfg.to_json())
    _built(lambda: cfg.build_model(), "model", raw["model"])  # cheap, and what a run needs first
    return cfg


def _built(make, section: str, sec: dict):
    """``make()``; a ValueError, TypeError or OverflowError it raises (a constraint between keys, e.g.
    beta * |B| too large) becomes a ConfigError naming the key the message names, else the section."""
    try:
        return make()
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        msg = str(exc)
        words = re.findall(r"[A-Za-z_]+", msg.split(":")[0])  # the key the message is about comes first
        key = next((w for w in words if w in sec), None)
        where = f"{section}.{key}" if key else f"[{section}]"
        raise ConfigError(where, sec.get(key) if key else None, f"a value the run can use ({msg})") from None


def load_config(path) -> ExperimentConfig:
    """Read and validate an experiment TOML file (see :func:`parse_config`)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"experiment file not found: {p}" + (" (a directory)" if p.is_dir() else ""))
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("file", str(p), f"a UTF-8 TOML text file ({exc.reason} at byte {exc.start})") from None
    return parse_config(text)


# ----------------------------------------------------------------------------------------- TOML writer
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if not math.isfinite(v):
            return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (the parts of a composite model)
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(data: dict) -> str:
    """TOML text for a dict of scalars and one level of tables (the shape of an experiment config)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items() if vv is not None)
    return "\n".join(lines) + "\n"
