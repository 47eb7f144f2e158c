r"""Models built from terms: sums, multi-head attention, layer-wise weights, a feed-forward term (issue #18).

A model is a sum of terms, each contributing velocity at the points the solver (or the particle code)
asks for; terms add with ``+``::

    sp.Attention(B, V, beta) + sp.FeedForward(W1, b1, W2, b2)          # a transformer block
    sp.MultiHead([sp.Attention(B1, V1, 2.0), sp.Attention(B2, V2, 5.0)], weights=[0.5, 0.5])
    sp.Layers([(0.0, block_1), (2.0, block_2)])                        # weights that change with depth

The numerics see a model through two functions of this module: :func:`resolve` (the model in force on
the time interval that starts at t: no :class:`Layers` left) and :func:`decompose` (its local terms
and its attention heads with their weights), and through :func:`boundaries` (the times where the
weights jump, where steps must end). The solver and :func:`~spherepde.simulate_particles` evaluate
every head with its own certified attention evaluation and sum the contributions; the solver keeps one
evaluator (:mod:`spherepde.evaluation`) per head of :func:`attention_heads`.

Classes
-------
``Sum``
    ``terms`` added: v = sum_k v_k. Nested sums are flattened.
``MultiHead``
    H attention heads (B_h, V_h, beta_h) and weights w_h: v = P_x(sum_h w_h V_h m_h(x)), each m_h with its
    own error bound ``tol``. Default weights 1 / H (the average), so identical heads are one head.
``FeedForward``
    v = P_x(W2 sigma(W1 x + b1) + b2), a local field (the MLP of a transformer block), activations
    :data:`ACTIVATIONS`.
``Layers``
    ``[(t_start, model), ...]``: the model in force from each t_start to the next (piecewise constant in
    depth t, right-continuous); the paper's shared weights are one layer.
``Noise``
    Brownian motion of the tokens, sigma dW_t on the sphere: the Fokker-Planck term
    (sigma^2 / 2) Delta_S f of the PDE (:mod:`spherepde.diffusion`), and the projected Euler-Maruyama
    increment of the tokens. Not a velocity: its ``field`` is zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import erf

from .._checks import as_points, finite_float, real_array
from .base import Model, tangent_project

__all__ = ["Sum", "MultiHead", "FeedForward", "Layers", "Noise", "ACTIVATIONS", "resolve", "decompose",
           "boundaries", "interval_index", "describe", "noise_diffusivity", "attention_scale", "attention_kernels",
           "attention_heads"]


def _relu(z):
    return np.maximum(z, 0.0)


def _gelu(z):  # the exact GELU, z Phi(z)
    return 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for any z


def _identity(z):
    return z


#: The activations of :class:`FeedForward`, by name.
ACTIVATIONS = {"relu": _relu, "gelu": _gelu, "tanh": np.tanh, "sigmoid": _sigmoid, "identity": _identity}


def _check_dims(terms, what: str) -> int:
    dims = {getattr(t, "dim", None) for t in terms}
    if len(dims) != 1 or None in dims:
        raise ValueError(f"the {what} must all have the same dimension d, got {sorted(map(str, dims))}")
    return dims.pop()


def _prefixed(models, state: dict, get: bool):
    if get:
        return {f"{i}.{k}": v for i, m in enumerate(models) for k, v in m.get_state().items()}
    for i, m in enumerate(models):
        pre = f"{i}."
        m.set_state({k[len(pre):]: v for k, v in state.items() if k.startswith(pre)})
    return None


class Sum(Model):
    """Terms added: v(x) = sum_k v_k(x). Made by ``term_1 + term_2``; nested sums are flattened.

    ``steady`` and ``local`` hold when they hold for every term.
    """

    def __init__(self, terms):
        flat = []
        for t in terms:
            if isinstance(t, Sum):
                flat.extend(t.terms)
            elif isinstance(t, Model) and hasattr(t, "field"):
                flat.append(t)
            else:
                raise TypeError(f"a term must be a spherepde model (Attention, FeedForward, ...), got "
                                f"{type(t).__name__}")
        if not flat:
            raise ValueError("a Sum needs at least one term")
        dims = [t.dim for t in flat if not isinstance(t, Noise)]
        if dims:  # a Noise term takes the dimension of the terms it is added to
            flat = [Noise(t.sigma, dims[0]) if isinstance(t, Noise) and t.dim != dims[0] else t for t in flat]
        self.terms = tuple(flat)
        self.dim = _check_dims(self.terms, "terms of a sum")
        self.steady = all(getattr(t, "steady", False) for t in self.terms)
        self.local = all(getattr(t, "local", False) for t in self.terms)

    def __repr__(self):
        return " + ".join(repr(t) for t in self.terms)

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        return sum(np.asarray(term.field(points, t, grid, density), float) for term in self.terms)

    def speed_bound(self) -> float:
        return float(sum(t.speed_bound() for t in self.terms))

    def get_state(self) -> dict:
        return _prefixed(self.terms, {}, True)

    def set_state(self, state: dict):
        _prefixed(self.terms, state, False)


def _attention_types():
    from .attention import Attention

    return (Attention,)


@dataclass(frozen=True, eq=False)
class MultiHead(Model):
    """Multi-head attention: v(x) = P_x(sum_h w_h V_h m_h(x)), m_h the softmax mean of head h.

    Parameters
    ----------
    heads : sequence of Attention
        The heads (B_h, V_h, beta_h, each with its own tolerance and method), of one dimension d.
    weights : sequence of float, optional
        w_h, finite; default 1 / H for every head (so H identical heads equal one head).
    """

    heads: tuple
    weights: tuple | None = None
    dim: int = field(init=False)

    steady = False
    local = False

    def __post_init__(self):
        heads = tuple(self.heads) if not isinstance(self.heads, Model) else (self.heads,)
        if not heads:
            raise ValueError("MultiHead needs at least one head")
        bad = [type(h).__name__ for h in heads if not isinstance(h, _attention_types())]
        if bad:
            raise TypeError(f"MultiHead heads must be spherepde.Attention objects, got {bad}")
        d = _check_dims(heads, "heads")
        if self.weights is None:
            w = np.full(len(heads), 1.0 / len(heads))
        else:
            w = real_array(self.weights, "weights").reshape(-1)
            if w.shape != (len(heads),) or not np.all(np.isfinite(w)):
                raise ValueError(f"weights must be {len(heads)} finite numbers (one per head), got "
                                 f"{self.weights!r}")
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "weights", tuple(float(x) for x in w))
        object.__setattr__(self, "dim", d)

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        return sum(w * np.asarray(h.field(points, t, grid, density), float) for w, h in zip(self.weights, self.heads))

    def speed_bound(self) -> float:
        return float(sum(abs(w) * h.speed_bound() for w, h in zip(self.weights, self.heads)))

    def get_state(self) -> dict:
        return _prefixed(self.heads, {}, True)

    def set_state(self, state: dict):
        _prefixed(self.heads, state, False)


@dataclass(frozen=True, eq=False)
class FeedForward(Model):
    """The feed-forward (MLP) term of a transformer block: v(x) = P_x(W2 sigma(W1 x + b1) + b2).

    Parameters
    ----------
    W1 : (m, d) array_like
    b1 : (m,) array_like
    W2 : (d, m) array_like
    b2 : (d,) array_like
    activation : str, default "relu"
        One of :data:`ACTIVATIONS`: "relu", "gelu" (exact, z Phi(z)), "tanh", "sigmoid", "identity".

    A local, steady field (it depends on x only), so the solver evaluates it once per run.
    """

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    activation: str = "relu"
    dim: int = field(init=False)

    steady = True
    local = True

    def __post_init__(self):
        W1 = real_array(self.W1, "W1")
        if W1.ndim != 2 or W1.shape[0] < 1 or W1.shape[1] < 2:
            raise ValueError(f"W1 must be an (m, d) matrix with m >= 1 and d >= 2, got shape {W1.shape}")
        m, d = W1.shape
        b1 = real_array(self.b1, "b1").reshape(-1)
        W2 = real_array(self.W2, "W2")
        b2 = real_array(self.b2, "b2").reshape(-1)
        if b1.shape != (m,):
            raise ValueError(f"b1 must have shape ({m},) (the rows of W1), got {b1.shape}")
        if W2.shape != (d, m):
            raise ValueError(f"W2 must have shape ({d}, {m}) (W1 is {m} x {d}), got {W2.shape}")
        if b2.shape != (d,):
            raise ValueError(f"b2 must have shape ({d},), got {b2.shape}")
        for name, a in (("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2)):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{name} must be finite")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {self.activation!r}")
        for name, a in (("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2)):
            object.__setattr__(self, name, a)
        object.__setattr__(self, "dim", d)

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        x = as_points(points, self.dim)
        sigma = ACTIVATIONS[self.activation]
        return tangent_project(x, sigma(x @ self.W1.T + self.b1) @ self.W2.T + self.b2)

    def speed_bound(self) -> float:
        # z = W1 x + b1 has |z|_2 <= ||W1||_2 + |b1| = r for |x| = 1. Componentwise |relu(z)|, |gelu(z)|,
        # |tanh(z)| <= |z|, and |tanh|, |sigmoid| <= 1, so |sigma(z)|_2 <= r (relu, gelu, identity),
        # min(r, sqrt(m)) (tanh), sqrt(m) (sigmoid); and |P_x y| <= |y|
        r = float(np.linalg.norm(self.W1, 2) + np.linalg.norm(self.b1))
        root_m = math.sqrt(self.W1.shape[0])
        s = {"tanh": min(r, root_m), "sigmoid": root_m}.get(self.activation, r)
        return float(np.linalg.norm(self.W2, 2) * s + np.linalg.norm(self.b2))


@dataclass(frozen=True, eq=False)
class Noise(Model):
    """Noise of strength sigma: tokens dX = v dt + sigma dW on S^(d-1) (Brownian motion on the sphere), the
    density d_t f + div_S(f v) = (sigma^2 / 2) Delta_S f.

    Parameters
    ----------
    sigma : float >= 0
    dim : int, default 3
        d of S^(d-1); ``term + Noise(sigma)`` takes the other term's d.

    Noise terms add as independent Brownian motions (their sigma^2 add).
    """

    sigma: float
    dim: int = 3

    steady = True
    local = True

    def __post_init__(self):
        object.__setattr__(self, "sigma", finite_float(self.sigma, "sigma", low=0.0))
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) or self.dim < 2:
            raise ValueError(f"dim must be an integer >= 2 (d of S^(d-1)), got {self.dim!r}")
        object.__setattr__(self, "dim", int(self.dim))

    @property
    def diffusivity(self) -> float:
        """sigma^2 / 2, the coefficient of the Laplace-Beltrami operator."""
        return 0.5 * self.sigma ** 2

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        return np.zeros_like(as_points(points, self.dim))

    def speed_bound(self) -> float:
        return 0.0



def add(a, b):
    """``a + b`` of two models: their Sum (a Noise term takes the dimension of the other terms)."""
    if not (isinstance(a, Model) and isinstance(b, Model)):
        return NotImplemented
    return Sum([a, b])


def has_noise(model) -> bool:
    """Whether any layer of the model has a Noise term with sigma > 0."""
    starts = (0.0,) + boundaries(model)
    return any(noise_diffusivity(resolve(model, t)) > 0 for t in starts)


def noise_diffusivity(model) -> float:
    """sigma^2 / 2 summed over the Noise terms of a resolved model (0 without noise)."""
    if isinstance(model, Noise):
        return model.diffusivity
    if isinstance(model, Sum):
        return float(sum(noise_diffusivity(m) for m in model.terms))
    return 0.0


class Layers(Model):
    """Layer-wise weights: ``[(t_start, model), ...]``, each model in force from its t_start (inclusive) to
    the next t_start; the first t_start must be 0. The models may themselves be sums or multi-head.

    The solver and the particle code end a step at every layer boundary, so each step sees one layer
    (a run equals the concatenation of the one-layer runs, see the tests).
    """

    def __init__(self, layers):
        items = []
        for item in layers:
            try:
                t0, model = item
            except (TypeError, ValueError):
                raise TypeError(f"a layer must be a pair (t_start, model), got {item!r}") from None
            t0 = finite_float(t0, "t_start", low=0.0)
            if isinstance(model, Layers):
                raise TypeError("a layer's model cannot itself be Layers (list the layers instead)")
            if not (isinstance(model, Model) and hasattr(model, "field")):
                raise TypeError(f"a layer's model must be a spherepde model, got {type(model).__name__}")
            items.append((t0, model))
        if not items:
            raise ValueError("Layers needs at least one (t_start, model)")
        starts = [t for t, _ in items]
        if starts[0] != 0.0:
            raise ValueError(f"the first layer must start at t_start = 0, got {starts[0]}")
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"layer t_start values must be strictly increasing, got {starts}")
        self.layers = tuple(items)
        self.dim = _check_dims([m for _, m in items], "models of the layers")
        self.local = all(getattr(m, "local", False) for _, m in items)
        self.steady = len(items) == 1 and bool(getattr(items[0][1], "steady", False))

    def __repr__(self):
        return f"Layers({list(self.layers)!r})"

    @property
    def starts(self) -> tuple:
        return tuple(t for t, _ in self.layers)

    def index_at(self, t: float) -> int:
        """The layer in force on the interval that starts at ``t`` (right-continuous)."""
        return max(0, int(np.searchsorted(self.starts, float(t), side="right")) - 1)

    def model_at(self, t: float):
        return self.layers[self.index_at(t)][1]

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:
        return self.model_at(t).field(points, t, grid, density)

    def speed_bound(self) -> float:
        return float(max(m.speed_bound() for _, m in self.layers))

    def get_state(self) -> dict:
        return _prefixed([m for _, m in self.layers], {}, True)

    def set_state(self, state: dict):
        _prefixed([m for _, m in self.layers], state, False)


# ------------------------------------------------------------------------ what the numerics use
def resolve(model, t: float):
    """The model in force on the time interval that starts at ``t``: every :class:`Layers` replaced by
    its layer at t (a Sum keeps its other terms)."""
    if isinstance(model, Layers):
        return resolve(model.model_at(t), t)
    if isinstance(model, Sum):
        terms = [resolve(m, t) for m in model.terms]
        return terms[0] if len(terms) == 1 else Sum(terms) if any(a is not b for a, b in zip(terms, model.terms)) \
            else model
    return model


def boundaries(model) -> tuple:
    """The sorted times > 0 at which the model's weights jump (layer starts), where a step must end."""
    out = set()
    if isinstance(model, Layers):
        out.update(model.starts[1:])
        for _, m in model.layers:
            out.update(boundaries(m))
    elif isinstance(model, Sum):
        for m in model.terms:
            out.update(boundaries(m))
    return tuple(sorted(out))


def interval_index(bounds: tuple, t: float) -> int:
    """Which of the intervals [0, b_1), [b_1, b_2), ... of the sorted layer ``bounds`` holds ``t`` (a step that
    starts on a boundary belongs to the layer that begins there)."""
    return int(np.searchsorted(bounds, float(t), side="right")) if bounds else 0


def next_boundary(model, t: float, bounds: tuple | None = None) -> float:
    """The first layer boundary after ``t`` (inf if none)."""
    b = boundaries(model) if bounds is None else bounds
    i = int(np.searchsorted(b, float(t) + 1e-13 * max(1.0, abs(t)), side="right"))
    return b[i] if i < len(b) else math.inf


def decompose(model):
    """(local terms, heads) of a resolved model: the local terms (their fields add) and the nonlocal
    attention-type terms as (weight, term) pairs, so that v = sum(local) + sum_h w_h v_h."""
    if isinstance(model, Layers):
        raise TypeError("decompose needs a resolved model: call resolve(model, t) first")
    if isinstance(model, Sum):
        local, heads = [], []
        for m in model.terms:
            lo, he = decompose(m)
            local += lo
            heads += he
        return local, heads
    if isinstance(model, MultiHead):
        return [], list(zip(model.weights, model.heads))
    if isinstance(model, Noise):  # not a velocity: the numerics treat it through noise_diffusivity
        return [], []
    if getattr(model, "local", False):
        return [model], []
    return [], [(1.0, model)]


def attention_heads(model, prefix: str = ""):
    """(key, head) for every attention head of the model, through sums, multi-head terms and layers, in a
    fixed order: the key is the head's path in the model ("" for a single head, "1." for term or head 1,
    "0.1." for head 1 of layer 0), under which the solver checkpoints the state of the head's evaluator.
    A head is a term with an ``evaluator()`` (:class:`~spherepde.Attention`)."""
    if isinstance(model, Layers):
        parts = [m for _, m in model.layers]
    elif isinstance(model, Sum):
        parts = list(model.terms)
    elif isinstance(model, MultiHead):
        parts = list(model.heads)
    else:
        return [(prefix, model)] if callable(getattr(model, "evaluator", None)) else []
    return [kh for i, m in enumerate(parts) for kh in attention_heads(m, f"{prefix}{i}.")]


def describe(model) -> str:
    """A one-line description of a model's structure (for logs)."""
    if isinstance(model, Layers):
        return "Layers(" + ", ".join(f"t >= {t:g}: {describe(m)}" for t, m in model.layers) + ")"
    if isinstance(model, Sum):
        return " + ".join(describe(m) for m in model.terms)
    if isinstance(model, MultiHead):
        return f"MultiHead({len(model.heads)} heads)"
    if isinstance(model, Noise):
        return f"Noise({model.sigma:g})"
    return type(model).__name__


def attention_kernels(model) -> list:
    """The finite-temperature attention kernels of a resolved model, ``[(beta_h, B_h), ...]`` over its heads
    (w(x, y) = exp(beta_h <x, B_h y>)): what a refinement criterion that follows the attention weights needs
    (:func:`spherepde.grids.adaptive.attended_density`)."""
    out = []
    for _, head in decompose(model)[1]:
        beta, B = getattr(head, "beta", None), getattr(head, "B", None)
        if beta is None or B is None or not np.isfinite(beta):
            continue
        out.append((float(beta), np.asarray(B, float)))
    return out


def attention_scale(model) -> float:
    """The attention's angular scale of a resolved model: max over its heads of beta_h ||B_h||_2 (the largest
    concentration of the kernel exp(beta <x, B y>)), 0 without a finite-temperature head. An adaptive grid
    refines where a cell's size times this exceeds its threshold (:class:`spherepde.grids.adaptive.Refinement`):
    across such a cell the attention weights vary by a factor exp(beta ||B|| h)."""
    return max((beta * float(np.linalg.norm(B, 2)) for beta, B in attention_kernels(model)), default=0.0)
