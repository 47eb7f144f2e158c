r"""Exact solution of the zero-temperature equation by backward characteristics.

Notes
-----
The zero-temperature equation d_t f + div_S(f v_inf) = 0 is linear with a steady field, so along
characteristics dX/dt = v_inf(X),

.. math:: f_t(X_t) = f_0(X_0) \exp\Big(-\int_0^t (\mathrm{div}_S v_\infty)(X_s)\,ds\Big).

For a point x we integrate Y' = -v_inf(Y), L' = div_S v_inf(Y) from Y(0) = x, L(0) = 0 to time t (so
Y(t) = X_0 and L(t) = int_0^t div(X_s) ds), with the classical 4th-order Runge-Kutta method on the
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


@njit(parallel=True, cache=True)
def _backward(points, Bm, Am, t, n_steps, Y, L):
    n, d = points.shape
    BBt = Bm @ Bm.T
    trA = 0.0
    for i in range(d):
        trA += Am[i, i]
    h = t / n_steps
    for p in prange(n):
        y = points[p].copy()
        k1 = np.empty(d + 1)
        k2 = np.empty(d + 1)
        k3 = np.empty(d + 1)
        k4 = np.empty(d + 1)
        tmp = np.empty(d)
        acc = 0.0
        for _ in range(n_steps):
            _rhs(y, Bm, Am, BBt, trA, d, k1)
            for i in range(d):
                tmp[i] = y[i] + 0.5 * h * k1[i]
            _rhs(tmp, Bm, Am, BBt, trA, d, k2)
            for i in range(d):
                tmp[i] = y[i] + 0.5 * h * k2[i]
            _rhs(tmp, Bm, Am, BBt, trA, d, k3)
            for i in range(d):
                tmp[i] = y[i] + h * k3[i]
            _rhs(tmp, Bm, Am, BBt, trA, d, k4)
            nrm = 0.0
            for i in range(d):
                y[i] += h / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i])
                nrm += y[i] * y[i]
            nrm = np.sqrt(nrm)
            for i in range(d):
                y[i] /= nrm
            acc += h / 6.0 * (k1[d] + 2.0 * k2[d] + 2.0 * k3[d] + k4[d])
        for i in range(d):
            Y[p, i] = y[i]
        L[p] = acc


def _default_steps(model, t: float) -> int:
    # |v| <= sigma_max(V) and the field's derivatives scale with ||V|| cond(B). Measured for the paper
    # pair at t = 1 (scale 2): 200 steps give 1e-9, 400 steps 8e-11 in log f (RK4, error ~ n^-4);
    # 300 steps per unit of t * scale keeps it near 1e-10 (tests/test_exact.py checks this).
    scale = np.linalg.norm(model.V, 2) * max(1.0, model.condition)
    return int(np.clip(np.ceil(abs(t) * scale * 300), 50, 200000))


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
    _backward(np.ascontiguousarray(x), np.ascontiguousarray(model.B), np.ascontiguousarray(model.A), t,
              n_steps, Y, L)
    return Y, L


def exact_zero_temperature(model, f0, points, t: float, n_steps: int | None = None) -> np.ndarray:
    """Exact density f_t at ``points`` (n, d) of the zero-temperature equation from ``f0(x) -> (n,)``.

    Parameters
    ----------
    model : ZeroTemperature
    f0 : callable on unit vectors (n, d) returning (n,)
    points : (n, d) unit vectors
    t : time >= 0
    n_steps : RK4 steps along each characteristic (default: enough for ~1e-12 relative accuracy)
    """
    X0, L = characteristics_backward(model, points, t, n_steps)
    return np.asarray(f0(X0), float) * np.exp(-L)


def exact_cell_averages(grid, model, f0, t: float, order: int | None = None,
                        n_steps: int | None = None) -> np.ndarray:
    """Exact cell averages on ``grid`` of the zero-temperature solution at time ``t`` (quadrature of
    :func:`exact_zero_temperature` with the grid's sub-cell rule of Gauss order ``order``)."""
    return grid.cell_average(lambda x: exact_zero_temperature(model, f0, x, t, n_steps), order=order)
