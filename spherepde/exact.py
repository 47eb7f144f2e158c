r"""Exact solution of the zero-temperature equation by backward characteristics.

Notes
-----
The zero-temperature equation d_t f + div_S(f v_inf) = 0 is linear with a steady field, so along
characteristics dX/dt = v_inf(X),

.. math:: f_t(X_t) = f_0(X_0) \exp\Big(-\int_0^t (\mathrm{div}_S v_\infty)(X_s)\,ds\Big).

For a point x we integrate Y' = -v_inf(Y), L' = div_S v_inf(Y) from Y(0) = x, L(0) = 0 to time t (so
Y(t) = X_0 and L(t) = int_0^t div(X_s) ds), with Butcher's 6th-order Runge-Kutta method on the
augmented system, renormalising Y onto the sphere after each step (v_inf is tangent, so this changes the
solution only at the integrator's order). The number of steps is chosen so that the integration error
is far below any finite-volume error (see ``tests/test_exact.py`` for the measured convergence).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._checks import as_points, finite_float, positive_int

__all__ = ["exact_zero_temperature", "exact_cell_averages", "characteristics_backward"]


@njit(cache=True, inline="always")
def _rhs(y, Bm, Am, BBt, trA, d, out):
    """out[:d] = -v_inf(y), out[d] = div_S v_inf(y) for the unit(ish) vector y (length d)."""
    # b = B^T y, ax = A y, bb = B B^T y
    s2 = 0.0
    xax = 0.0
    yy = 0.0
    for i in range(d):
        yy += y[i] * y[i]
    for i in range(d):
        bi = 0.0
        ai = 0.0
        for j in range(d):
            bi += Bm[j, i] * y[j]
            ai += Am[i, j] * y[j]
        s2 += bi * bi
        xax += y[i] * ai
        out[i] = ai  # temporarily A y
    s = np.sqrt(s2)
    # div = (tr A - d <y, A y>)/s - <B B^T y, P_y(A y)>/s^3 ; v = P_y(A y)/s  (A = V B^T)
    bbp = 0.0
    for i in range(d):
        p = out[i] - xax / yy * y[i]
        bbi = 0.0
        for j in range(d):
            bbi += BBt[i, j] * y[j]
        bbp += bbi * p
        out[i] = -p / s
    out[d] = (trA - d * xax) / s - bbp / (s2 * s)


# Butcher's 7-stage, 6th-order explicit Runge-Kutta method (Butcher 1964; "Numerical Methods for
# Ordinary Differential Equations", 3rd ed., Sec. 324). Order 6 is checked in tests/test_exact.py.
_A = np.array([
    [0, 0, 0, 0, 0, 0, 0],
    [1 / 3, 0, 0, 0, 0, 0, 0],
    [0, 2 / 3, 0, 0, 0, 0, 0],
    [1 / 12, 1 / 3, -1 / 12, 0, 0, 0, 0],
    [-1 / 16, 9 / 8, -3 / 16, -3 / 8, 0, 0, 0],
    [0, 9 / 8, -3 / 8, -3 / 4, 1 / 2, 0, 0],
    [9 / 44, -9 / 11, 63 / 44, 18 / 11, 0, -16 / 11, 0],
])
_B = np.array([11 / 120, 0, 27 / 40, 27 / 40, -4 / 15, -4 / 15, 11 / 120])


@njit(parallel=True, cache=True)
def _backward(points, Bm, Am, t, n_steps, tabA, tabB, Y, L):
    n, d = points.shape
    S = tabB.shape[0]
    BBt = Bm @ Bm.T
    trA = 0.0
    for i in range(d):
        trA += Am[i, i]
    h = t / n_steps
    for p in prange(n):
        y = points[p].copy()
        K = np.empty((S, d + 1))
        tmp = np.empty(d)
        acc = 0.0
        for _ in range(n_steps):
            for s in range(S):
                for i in range(d):
                    v = y[i]
                    for r in range(s):
                        v += h * tabA[s, r] * K[r, i]
                    tmp[i] = v
                _rhs(tmp, Bm, Am, BBt, trA, d, K[s])
            nrm = 0.0
            for i in range(d):
                v = 0.0
                for s in range(S):
                    v += tabB[s] * K[s, i]
                y[i] += h * v
                nrm += y[i] * y[i]
            nrm = np.sqrt(nrm)
            for i in range(d):
                y[i] /= nrm
            v = 0.0
            for s in range(S):
                v += tabB[s] * K[s, d]
            acc += h * v
        for i in range(d):
            Y[p, i] = y[i]
        L[p] = acc


def _default_steps(model, t: float) -> int:
    # |v| <= sigma_max(V) and the field's derivatives scale with ||V|| cond(B). 60 steps per unit of
    # t * scale: measured for the paper pair at t = 1 (120 steps) the error in log f is ~1e-12
    # (tests/test_exact.py checks it against 2000 steps).
    scale = np.linalg.norm(model.V, 2) * max(1.0, model.condition)
    return int(np.clip(np.ceil(abs(t) * scale * 60), 20, 200000))


def characteristics_backward(model, points, t: float, n_steps: int | None = None):
    """Foot points X_0 and log-Jacobians int_0^t div v_inf(X_s) ds of the characteristics ending at
    ``points`` at time ``t``. Returns ``(X0 (n, d), L (n,))``."""
    x = as_points(points, model.dim)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    t = finite_float(t, "t", low=0.0)
    n_steps = _default_steps(model, t) if n_steps is None else positive_int(n_steps, "n_steps")
    Y = np.empty_like(x)
    L = np.empty(x.shape[0])
    if t == 0:
        return x.copy(), np.zeros(x.shape[0])
    Bu = model.B_unit  # the field does not depend on the scale of B; B_unit keeps |B^T x| finite
    _backward(np.ascontiguousarray(x), np.ascontiguousarray(Bu), np.ascontiguousarray(model.V @ Bu.T), t,
              n_steps, _A, _B, Y, L)
    return Y, L


def exact_zero_temperature(model, f0, points, t: float, n_steps: int | None = None) -> np.ndarray:
    """Exact density f_t at ``points`` (n, d) of the zero-temperature equation from ``f0(x) -> (n,)``.

    Parameters
    ----------
    model : ZeroTemperature
    f0 : callable on unit vectors (n, d) returning (n,)
    points : (n, d) unit vectors
    t : time >= 0
    n_steps : Runge-Kutta steps along each characteristic (default: enough for ~1e-12 relative accuracy)
    """
    X0, L = characteristics_backward(model, points, t, n_steps)
    return np.asarray(f0(X0), float) * np.exp(-L)


def exact_cell_averages(grid, model, f0, t: float, order: int | None = None,
                        n_steps: int | None = None) -> np.ndarray:
    """Exact cell averages on ``grid`` of the zero-temperature solution at time ``t`` (quadrature of
    :func:`exact_zero_temperature` with the grid's sub-cell rule of Gauss order ``order``)."""
    return grid.cell_average(lambda x: exact_zero_temperature(model, f0, x, t, n_steps), order=order)
