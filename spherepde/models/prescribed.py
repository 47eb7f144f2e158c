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
    dim : int, default 3
        Ambient dimension d (the sphere is S^(d-1)).
    steady : bool, default False
        Declare the field time-independent; the solver then evaluates it once.
    max_speed : float, optional
        An upper bound of |v| over the sphere and all times. When given, the time step is fixed from it;
        otherwise it is recomputed from the field at every step.
    """

    velocity: Callable
    dim: int = 3
    steady: bool = False
    max_speed: float | None = None

    local = True

    def __post_init__(self):
        if not callable(self.velocity):
            raise TypeError(f"velocity must be a callable velocity(x, t) -> (n, d), got {self.velocity!r}")
        positive_int(self.dim, "dim", minimum=2)
        if self.max_speed is not None:
            object.__setattr__(self, "max_speed", finite_float(self.max_speed, "max_speed", low=0.0))

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

    def speed_bound(self) -> float:
        return np.inf if self.max_speed is None else self.max_speed
