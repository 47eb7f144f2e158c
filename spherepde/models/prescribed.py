"""Prescribed (user-given) velocity fields, and the rigid-rotation helper."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .._checks import as_points, finite_float, positive_int
from .base import Model

__all__ = ["Prescribed"]


@dataclass(frozen=True, eq=False)
class Prescribed(Model):
    """A velocity field given by the user, ``velocity(x, t) -> (n, d)`` tangent to the sphere.

    Parameters
    ----------
    velocity : callable
        ``velocity(x, t)`` with ``x`` of shape (n, d) on the unit sphere; returns an (n, d) array of
        tangent vectors. The normal component, if any, is removed (the flux only sees the tangent part).
        A time-dependent field is called at every face Gauss point at every new stage time, about 100
        times the cost of a steady field at nside 256, with ``Options(field_time="exact")`` or fixed steps;
        the default ``field_time="auto"`` under error control calls it at time nodes only (error-controlled
        linear interpolation in time: 2.1-2.3 times the steady cost there), and :meth:`separable` and
        :meth:`compiled` are cheaper forms still.
    dim : int, default 3
        Ambient dimension d (the sphere is S^(d-1)).
    steady : bool, default False
        Declare the field time-independent; the solver then evaluates it once.
    max_speed : float, optional
        An upper bound of |v| over the sphere and all times. When given, the time step is fixed from it;
        otherwise it is recomputed from the field at every step.
    modes : tuple of (c, v), optional
        The field's time structure, v(x, t) = sum_k c_k(t) v_k(x) (made by :meth:`separable`): the solver
        then evaluates each v_k once at the face quadrature points and forms each stage's field as the
        combination, instead of calling ``velocity`` at every stage.
    kernel : Numba-compiled function, optional
        ``kernel(x, t, out)`` writing v(x, t) for one point x (d,) into out (d,) (made by
        :meth:`compiled`): the solver forms the normal velocities at the face points in one compiled pass.
    """

    velocity: Callable
    dim: int = 3
    steady: bool = False
    max_speed: float | None = None
    modes: tuple | None = None
    kernel: Callable | None = None

    local = True

    def __post_init__(self):
        if not callable(self.velocity):
            raise TypeError(f"velocity must be a callable velocity(x, t) -> (n, d), got {self.velocity!r}")
        positive_int(self.dim, "dim", minimum=2)
        if self.max_speed is not None:
            object.__setattr__(self, "max_speed", finite_float(self.max_speed, "max_speed", low=0.0))
        if self.kernel is not None and self.modes is not None:
            raise ValueError("give a field either modes (Prescribed.separable) or a kernel (Prescribed.compiled), not both")
        if self.modes is not None and self.steady:
            raise ValueError("a field with modes is time-dependent: give steady=False (or a steady field without modes)")

    @classmethod
    def separable(cls, modes, dim: int = 3, max_speed: float | None = None) -> "Prescribed":
        """A time-dependent field with a finite time structure, v(x, t) = sum_k c_k(t) v_k(x).

        ``modes`` is a sequence of pairs ``(c_k, v_k)``: ``c_k(t) -> float`` and ``v_k(x) -> (n, d)``
        (steady, tangent). Many test fields are of this form (the deformational flows of Nair and
        Lauritzen 2010 are cos(pi t / T) times a steady field; a rotating frame adds cos and sin
        modes). Why: a time-dependent field given as ``velocity(x, t)`` is a NumPy call at every face
        Gauss point twice per step (about 100 times the cost of a steady field at nside 256, issue #22);
        with the modes the solver evaluates each v_k once and the field's moments at a time cost one
        pass over the faces (one mode: 1.1 times a steady field, two: 2.6 times)
        (``validation/bench_transport.py`` measures both)."""
        modes = tuple(modes)
        if not modes:
            raise ValueError("modes must hold at least one pair (c(t), v(x))")
        for k, m in enumerate(modes):
            if not (isinstance(m, (tuple, list)) and len(m) == 2 and callable(m[0]) and callable(m[1])):
                raise TypeError(f"modes[{k}] must be a pair (c(t) -> float, v(x) -> (n, d)) of callables, got {m!r}")
        modes = tuple((c, v) for c, v in modes)

        def velocity(x, t=0.0):
            return sum(float(c(t)) * np.asarray(v(x), float) for c, v in modes)

        return cls(velocity, dim=dim, steady=False, max_speed=max_speed, modes=modes)

    @classmethod
    def compiled(cls, kernel, dim: int = 3, max_speed: float | None = None, steady: bool = False) -> "Prescribed":
        """A field given as a Numba-compiled point function, for time dependence of any form.

        ``kernel(x, t, out)``: a ``numba.njit`` function that writes v(x, t) (tangent, or its tangent part
        is taken) for one point ``x`` (d,) on the sphere into ``out`` (d,). Why: a plain NumPy
        ``velocity(x, t)`` is called at every face Gauss point twice per step, with its temporaries
        (about 100 times the cost of a steady field at nside 256, issue #22); the compiled function is
        called from inside the solver's own compiled loop over the faces, with no arrays in between
        (``validation/bench_transport.py`` measures the cost). Example::

            @numba.njit
            def swirl(x, t, out):  # a rotation about an axis that precesses about e3
                a0, a1, a2 = 0.3 * math.cos(t), 0.3 * math.sin(t), 1.0
                out[0] = a1 * x[2] - a2 * x[1]
                out[1] = a2 * x[0] - a0 * x[2]
                out[2] = a0 * x[1] - a1 * x[0]

            model = Prescribed.compiled(swirl, max_speed=1.05)

        The result is also an ordinary ``Prescribed`` (``velocity(x, t)`` works on any points: particles,
        plots). A kernel that writes NaN or inf is an error at the step that meets it."""
        if not (hasattr(kernel, "py_func") and callable(kernel)):
            raise TypeError(f"kernel must be a numba.njit function kernel(x, t, out), got {kernel!r}; for a "
                            "NumPy function velocity(x, t) -> (n, d) use Prescribed(velocity)")
        from ..kernels import fv

        def velocity(x, t=0.0):
            x = np.ascontiguousarray(x, dtype=float)
            out = np.empty_like(x)
            fv.compiled_points(kernel, x, float(t), out)
            return out

        return cls(velocity, dim=dim, steady=steady, max_speed=max_speed, kernel=kernel)

    @classmethod
    def rigid_rotation(cls, axis, omega: float = 1.0) -> "Prescribed":
        """Rigid rotation v(x) = omega * (a x x) about the unit axis ``a`` (d = 3); period 2 pi / omega."""
        a = np.asarray(axis, dtype=float)
        if a.shape != (3,) or not np.all(np.isfinite(a)) or np.linalg.norm(a) == 0:
            raise ValueError(f"axis must be a nonzero finite 3-vector, got {axis!r}")
        w = finite_float(omega, "omega") * a / np.linalg.norm(a)

        def rotation(x, t=0.0):
            return np.cross(w, x)

        return cls(rotation, dim=3, steady=True, max_speed=float(np.linalg.norm(w)))

    @classmethod
    def linear(cls, M) -> "Prescribed":
        """The steady field v(x) = P_x(M x) for a d x d matrix M (M skew gives a rigid rotation)."""
        M = np.array(M, dtype=float)
        if M.ndim != 2 or M.shape[0] != M.shape[1] or not np.all(np.isfinite(M)):
            raise ValueError(f"M must be a finite square matrix, got shape {M.shape}")

        def lin(x, t=0.0):
            mx = x @ M.T
            return mx - np.einsum("ij,ij->i", x, mx)[:, None] * x

        return cls(lin, dim=M.shape[0], steady=True, max_speed=float(np.linalg.norm(M, 2)))

    def field(self, points, t=0.0, grid=None, density=None):
        x = as_points(points, self.dim)
        v = np.asarray(self.velocity(x, t), dtype=float)
        if v.shape != x.shape:
            raise ValueError(f"velocity(x, t) must return shape {x.shape}, got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"velocity(x, t) returned NaN or inf at t = {t}")
        return v - np.einsum("ij,ij->i", x, v)[:, None] * x

    def mode_coefficients(self, t: float) -> np.ndarray:
        """(K,) the time factors c_k(t) of :meth:`separable` (checked finite)."""
        c = np.array([float(ck(t)) for ck, _ in self.modes])
        if not np.all(np.isfinite(c)):
            raise ValueError(f"a time factor c_k(t) of the modes is NaN or inf at t = {t}")
        return c

    def mode_field(self, k: int, points) -> np.ndarray:
        """The steady field v_k at ``points``, tangent part (checked as :meth:`field` checks)."""
        x = as_points(points, self.dim)
        v = np.asarray(self.modes[k][1](x), dtype=float)
        if v.shape != x.shape:
            raise ValueError(f"modes[{k}] v(x) must return shape {x.shape}, got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"modes[{k}] v(x) returned NaN or inf")
        return v - np.einsum("ij,ij->i", x, v)[:, None] * x

    def speed_bound(self) -> float:
        return np.inf if self.max_speed is None else self.max_speed
