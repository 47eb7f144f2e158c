"""The HEALPix base-face map (face, x, y) -> S^2 and its derivative, vectorised.

Inside each of the 12 base faces, HEALPix pixels are the squares of an nside x nside lattice in face
coordinates (x, y) in [0, 1]^2, and the map to the sphere is equal-area. This is the map behind
healpy's ``pix2vec`` and ``boundaries`` (``xyf2loc`` in the HEALPix C++ library, Gorski et al. 2005,
doi:10.1086/427976). Pixel edges are the lattice lines x = const and y = const: curved on the sphere,
not great-circle arcs. We use this map (and its analytic derivative) for exact edge geometry.

Increasing x + y moves north; increasing x - y moves east. The polar/equatorial transition
z = +-2/3 lies on the lines x + y = const through pixel corners (pixel W-E diagonals).
"""
from __future__ import annotations

import numpy as np

__all__ = ["face_map", "face_map_jacobian", "FACE_AREA"]

_JRLL = np.array([2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4], dtype=float)
_JPLL = np.array([1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7], dtype=float)

#: Area of one base face on the unit sphere (the map has this constant Jacobian).
FACE_AREA = np.pi / 3.0


def _zphi(face, x, y):
    """z, phi, and the partial derivatives dz/dx, dz/dy, dphi/dx, dphi/dy, sin(theta)."""
    face = np.asarray(face)
    jr = _JRLL[face] - x - y
    jp = _JPLL[face]
    north = jr < 1.0
    south = jr > 3.0
    nr = np.where(north, jr, np.where(south, 4.0 - jr, 1.0))
    # dnr/dx = dnr/dy = -1 in the north cap, +1 in the south cap, 0 on the equator belt.
    dnr = np.where(north, -1.0, np.where(south, 1.0, 0.0))
    t = nr * nr / 3.0
    z = np.where(north, 1.0 - t, np.where(south, t - 1.0, (2.0 - jr) * 2.0 / 3.0))
    dz = np.where(north, -2.0 * nr / 3.0 * dnr, np.where(south, 2.0 * nr / 3.0 * dnr, 2.0 / 3.0))
    # sin(theta), accurate near the poles: 1 - |z| = nr^2 / 3 in the caps.
    cap = north | south
    sth = np.where(cap, np.sqrt(np.maximum(t * (2.0 - t), 0.0)), np.sqrt(np.maximum(1.0 - z * z, 0.0)))
    # phi = (pi/4) (jp + (x - y)/nr); (x - y)/nr is bounded for points inside the face.
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(nr > 0, (x - y) / nr, 0.0)
        phi = 0.25 * np.pi * (jp + q)
        dq_dx = np.where(nr > 0, (1.0 - q * dnr) / nr, 0.0)
        dq_dy = np.where(nr > 0, (-1.0 - q * dnr) / nr, 0.0)
    return z, phi, sth, dz, 0.25 * np.pi * dq_dx, 0.25 * np.pi * dq_dy, nr, dnr, cap


def face_map(face, x, y) -> np.ndarray:
    """Points on S^2 for face coordinates ``(x, y)`` of base face ``face``; shape ``x.shape + (3,)``."""
    z, phi, sth, *_ = _zphi(face, np.asarray(x, float), np.asarray(y, float))
    return np.stack([sth * np.cos(phi), sth * np.sin(phi), z], axis=-1)


def face_map_jacobian(face, x, y):
    """Return ``X, dX/dx, dX/dy`` (each ``x.shape + (3,)``) of the face map.

    In the polar caps sin(theta) ~ nr and dphi ~ 1/nr: the product stays finite away from the pole
    vertex itself, which is only ever a pixel corner (never a quadrature point here).
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    z, phi, sth, dz, dphidx, dphidy, nr, dnr, cap = _zphi(face, x, y)
    c, s = np.cos(phi), np.sin(phi)
    # d(sin theta)/dx = -z dz/dx / sin(theta); in the caps, with t = nr^2/3,
    # sin(theta) = sqrt(t (2 - t)) and d sin(theta) = (1 - t) dt / sin(theta), dt = 2 nr dnr / 3,
    # which equals (1 - t) * (2/3) dnr / sqrt((2 - t)/3): finite at nr -> 0.
    t = nr * nr / 3.0
    with np.errstate(divide="ignore", invalid="ignore"):
        dsth_cap = (1.0 - t) * (2.0 / 3.0) * dnr / np.sqrt((2.0 - t) / 3.0)
        dsth_eq = -z * dz / sth
    dsth = np.where(cap, dsth_cap, dsth_eq)  # same for x and y (dz/dx = dz/dy, dnr/dx = dnr/dy)
    X = np.stack([sth * c, sth * s, z], axis=-1)
    # sin(theta) * dphi: in the caps sth ~ nr and dphi ~ 1/nr; multiply first for accuracy.
    dX = []
    for dphi in (dphidx, dphidy):
        sd = sth * dphi
        dX.append(np.stack([dsth * c - sd * s, dsth * s + sd * c, dz], axis=-1))
    return X, dX[0], dX[1]
