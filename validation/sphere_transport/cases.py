"""The standard transport tests on the sphere (unit radius), as velocity fields and initial densities.

- Williamson et al. (1992), test case 1: solid-body rotation of a cosine bell (radius 1/3, centre
  (3 pi / 2, 0)), one revolution in time 2 pi, about an axis tilted by ``alpha`` from the pole
  (alpha = 0: along the equator; alpha = pi / 2: over the poles).
- Lauritzen et al. (2012, Geosci. Model Dev. 5, 887), deformational flows of Nair and Lauritzen (2010),
  period T = 5: case 1 (non-divergent) u = k sin^2(lon) sin(2 lat) cos(pi t / T),
  v = k sin(2 lon) cos(lat) cos(pi t / T), k = 2.4; case 3 (divergent)
  u = -k sin^2(lon / 2) sin(2 lat) cos^2(lat) cos(pi t / T), v = (k / 2) sin(lon) cos^3(lat) cos(pi t / T),
  k = 1. The flow reverses (v(T - t) = -v(t)), so at t = T the exact density is the initial one, for
  the continuity equation too (the flow map over [0, T] is the identity, Jacobian 1). Initial data:
  Gaussian hills (0.95 exp(-5 |x - x_i|^2), two hills at lon 5 pi / 6 and 7 pi / 6 on the equator),
  cosine bells (0.1 + 0.9 h_i, radius 1/2), slotted cylinders (0.1 / 1, radius 1/2, the slots of the
  paper). Each field is separable in time (``Prescribed.separable``).

Everything here is plain NumPy on points x (n, 3), and on (lon, lat) arrays for the lat-lon peer.
"""
from __future__ import annotations

import numpy as np

T_DEFORM = 5.0


def lonlat(x):
    x = np.asarray(x, float)
    return np.arctan2(x[:, 1], x[:, 0]) % (2 * np.pi), np.arcsin(np.clip(x[:, 2], -1, 1))


def to_cartesian(lon, lat, u, v):
    """Tangent vectors (n, 3) from eastward u and northward v at (lon, lat)."""
    e_lon = np.stack([-np.sin(lon), np.cos(lon), np.zeros_like(lon)], axis=1)
    e_lat = np.stack([-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)], axis=1)
    return u[:, None] * e_lon + v[:, None] * e_lat


def _xyz(lon, lat):
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1)


def great_circle(lon, lat, lon0, lat0):
    return np.arccos(np.clip(np.sin(lat) * np.sin(lat0) + np.cos(lat) * np.cos(lat0) * np.cos(lon - lon0), -1, 1))


# ------------------------------------------------------------------ velocities (u, v) on lon, lat

def tc1_uv(lon, lat, alpha):
    """Solid-body rotation of angular speed 1 (one revolution in 2 pi), axis tilted by alpha."""
    u = np.cos(lat) * np.cos(alpha) + np.sin(lat) * np.cos(lon) * np.sin(alpha)
    v = -np.sin(lon) * np.sin(alpha)
    return u, v


def deform_uv(lon, lat, case):
    """The steady spatial part of the deformational flows (times cos(pi t / T))."""
    if case == "nondivergent":  # Lauritzen et al. 2012, case 1
        k = 2.4
        return k * np.sin(lon) ** 2 * np.sin(2 * lat), k * np.sin(2 * lon) * np.cos(lat)
    if case == "divergent":  # case 3
        k = 1.0
        return (-k * np.sin(lon / 2) ** 2 * np.sin(2 * lat) * np.cos(lat) ** 2,
                0.5 * k * np.sin(lon) * np.cos(lat) ** 3)
    raise ValueError(f"case must be 'nondivergent' or 'divergent', got {case!r}")


def time_factor(t):
    return np.cos(np.pi * t / T_DEFORM)


def velocity_points(uv):
    """v(x) (n, 3) from a (u, v)(lon, lat) function."""
    def v(x):
        lon, lat = lonlat(x)
        u, w = uv(lon, lat)
        return to_cartesian(lon, lat, u, w)
    return v


# ------------------------------------------------------------------ initial data on lon, lat

def cosine_bell_tc1(lon, lat):
    r = great_circle(lon, lat, 1.5 * np.pi, 0.0)
    R = 1.0 / 3.0
    return np.where(r < R, 0.5 * (1 + np.cos(np.pi * r / R)), 0.0)


_CENTRES = ((5 * np.pi / 6, 0.0), (7 * np.pi / 6, 0.0))


def gaussian_hills(lon, lat):
    x = _xyz(lon, lat)
    out = 0.0
    for lo, la in _CENTRES:
        c = _xyz(np.float64(lo), np.float64(la))
        out = out + 0.95 * np.exp(-5.0 * np.sum((x - c) ** 2, axis=-1))
    return out


def cosine_bells(lon, lat):
    h = 0.0
    for lo, la in _CENTRES:
        r = great_circle(lon, lat, lo, la)
        h = h + np.where(r < 0.5, 0.5 * (1 + np.cos(2 * np.pi * r)), 0.0)
    return 0.1 + 0.9 * h


def slotted_cylinders(lon, lat):
    out = np.full(np.shape(lon), 0.1)
    (l1, t1), (l2, t2) = _CENTRES
    r1 = great_circle(lon, lat, l1, t1)
    r2 = great_circle(lon, lat, l2, t2)
    c1 = (r1 <= 0.5) & ((np.abs(lon - l1) >= 1 / 12) | (lat - t1 >= 5 / 24))
    c2 = (r2 <= 0.5) & ((np.abs(lon - l2) >= 1 / 12) | (lat - t2 <= -5 / 24))
    return np.where(c1 | c2, 1.0, out)


INITIAL = {"cosine_bell": cosine_bell_tc1, "gaussian_hills": gaussian_hills, "cosine_bells": cosine_bells,
           "slotted_cylinders": slotted_cylinders}


def on_points(fn):
    def f(x):
        lon, lat = lonlat(x)
        return fn(lon, lat)
    return f


#: The suite: name -> (flow, flow parameter, initial data, smooth?, final time)
CASES = {
    "tc1_alpha0": ("tc1", 0.0, "cosine_bell", False, 2 * np.pi),
    "tc1_poles": ("tc1", np.pi / 2, "cosine_bell", False, 2 * np.pi),
    "nondiv_gaussian_hills": ("deform", "nondivergent", "gaussian_hills", True, T_DEFORM),
    "nondiv_cosine_bells": ("deform", "nondivergent", "cosine_bells", False, T_DEFORM),
    "nondiv_slotted_cylinders": ("deform", "nondivergent", "slotted_cylinders", False, T_DEFORM),
    "div_gaussian_hills": ("deform", "divergent", "gaussian_hills", True, T_DEFORM),
    "div_cosine_bells": ("deform", "divergent", "cosine_bells", False, T_DEFORM),
}
