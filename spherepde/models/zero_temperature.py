"""Zero-temperature (beta = infinity) model: v_inf(x) = P_x(V B^T x) / |B^T x|."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._checks import as_matrix, as_points
from .base import Model, tangent_project

__all__ = ["ZeroTemperature", "MAX_CONDITION"]

#: Largest accepted condition number of B: beyond it |B^T x| loses all relative accuracy.
MAX_CONDITION = 1e12


def _check_invertible(B: np.ndarray) -> float:
    cond = float(np.linalg.cond(B))
    if not np.isfinite(cond) or cond > MAX_CONDITION:
        raise ValueError(
            f"B must be invertible for the zero-temperature model: its condition number is {cond:.3e} "
            f"(allowed: <= {MAX_CONDITION:.0e}); v_inf = P_x(V B^T x)/|B^T x| is undefined where B^T x = 0"
        )
    return cond


@dataclass(frozen=True, eq=False)
class ZeroTemperature(Model):
    r"""The zero-temperature limit of the transformer continuity equation.

    Parameters
    ----------
    B : (d, d) array_like
        Attention matrix B = Q^T K (score <x, B y>). Must be invertible (condition number <= 1e12).
    V : (d, d) array_like
        Value matrix.

    Notes
    -----
    The field is local and steady,

    .. math:: v_\infty(x) = P_x(V B^\top x) / |B^\top x|, \qquad P_x(y) = y - \langle x, y\rangle x,

    and its surface divergence on the unit sphere, with A = V B^T and s = |B^T x|, is

    .. math:: \mathrm{div}_S v_\infty = (\mathrm{tr} A - d \langle x, A x\rangle)/s
              - \langle B B^\top x, P_x(A x)\rangle / s^3 .
    """

    B: np.ndarray
    V: np.ndarray
    dim: int = field(init=False)
    condition: float = field(init=False, repr=False)

    steady = True
    local = True

    def __post_init__(self):
        B = as_matrix(self.B, "B")
        V = as_matrix(self.V, "V", d=B.shape[0])
        object.__setattr__(self, "B", B)
        object.__setattr__(self, "V", V)
        object.__setattr__(self, "dim", B.shape[0])
        object.__setattr__(self, "condition", _check_invertible(B))
        scale = float(np.max(np.abs(B)))
        object.__setattr__(self, "B_unit", B / scale)

    # B_unit: B scaled to max |B_ij| = 1. v_inf and its divergence do not depend on the scale of B, and
    # |B^T x| of a B scaled by 1e200 overflows (v = 0) or by 1e-160 loses digits (issue #21 item 6), so the
    # formulas use B_unit.
    B_unit: np.ndarray = field(init=False, repr=False, compare=False)

    @property
    def A(self) -> np.ndarray:
        """A = V B^T, the matrix whose top eigenspace E attracts the zero-temperature flow."""
        return self.V @ self.B.T

    def velocity(self, points, t=0.0) -> np.ndarray:
        """v_inf at ``points`` of shape (n, d) (rows need not be exactly unit; P_x uses them as given)."""
        x = as_points(points, self.dim)
        bx = x @ self.B_unit  # rows: B^T x, up to the (irrelevant) scale of B
        s = np.linalg.norm(bx, axis=1)
        return tangent_project(x, bx @ self.V.T) / s[:, None]

    def divergence(self, points) -> np.ndarray:
        """Surface divergence div_S v_inf at unit ``points`` (n, d), closed form (MODEL.md)."""
        x = as_points(points, self.dim)
        Bu = self.B_unit  # the formula is invariant under B -> c B
        A = self.V @ Bu.T
        bx = x @ Bu
        s = np.linalg.norm(bx, axis=1)
        ax = x @ A.T
        xax = np.einsum("ij,ij->i", x, ax)
        bbx = bx @ Bu.T  # B B^T x
        pax = ax - xax[:, None] * x
        d = self.dim
        return (np.trace(A) - d * xax) / s - np.einsum("ij,ij->i", bbx, pax) / s**3

    def field(self, points, t=0.0, grid=None, density=None):
        return self.velocity(points)

    def speed_bound(self) -> float:
        # |P_x(V B^T x)| / |B^T x| <= |V B^T x| / |B^T x| <= sigma_max(V)
        return float(np.linalg.norm(self.V, 2))
