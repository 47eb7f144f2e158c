"""The model protocol: a small frozen object of physical parameters that gives the velocity.

A model is shared by the PDE solver and the particle code. The solver asks it for the velocity at
points (cell centres, face quadrature points) through :meth:`Model.field`, which receives the current
grid density for nonlocal models and ignores it for local ones.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Model", "tangent_project"]


def tangent_project(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P_x(y) = y - <x, y> x, row by row, for ``x`` and ``y`` of shape (n, d)."""
    return y - np.einsum("ij,ij->i", x, y)[:, None] * x


class Model:
    """Base class of velocity models on S^(d-1).

    Attributes every model sets: ``dim`` (d), ``steady`` (the field does not depend on time),
    ``local`` (the field does not depend on the density).
    """

    dim: int
    steady: bool = True
    local: bool = True
    #: For a nonlocal term of the attention form v = P_x(V m[f](x)): the (d, d) matrix V (the solver then
    #: forms the face weights m . V^T W in one fused kernel); None for every other model.
    value_matrix = None

    def field(self, points, t=0.0, grid=None, density=None) -> np.ndarray:  # pragma: no cover
        """Velocity at ``points`` (n, d) at time ``t`` for the grid density ``density``."""
        raise NotImplementedError

    def __add__(self, other):
        """``model + term``: a :class:`~spherepde.models.terms.Sum` (the velocities add)."""
        from .terms import add

        return add(self, other)

    def speed_bound(self) -> float:
        """An upper bound of |v| on the sphere, for any density and time (``inf`` if unknown)."""
        return np.inf

    def get_state(self) -> dict:
        """Scalars (name -> float) of the model's own history that the next field depends on, in the last
        bits (e.g. a cost heuristic's memory that picks between methods that agree to ``tol``). The solver
        checkpoints them with its state, so that a resumed run is identical bit for bit; default none."""
        return {}

    def set_state(self, state: dict):
        """Restore :meth:`get_state` (unknown names are ignored: a checkpoint of another version)."""
