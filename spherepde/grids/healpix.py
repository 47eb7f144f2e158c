"""HEALPix grid of S^2 (RING order) with exact curved pixel edges.

Geometry choice (documented in ``docs/user_guide.md``): a HEALPix pixel edge is the image of a
lattice segment x = const or y = const of its base face under the equal-area face map
(:mod:`spherepde.grids._healpix_map`), not a great-circle arc. We integrate fluxes over these exact
curves: Gauss points X(tau_g) on the edge and weighted normals W_g = w_g (dX/dtau x X), so that
sum_g u(X_g) . W_g -> int_edge u . n ds at the Gauss rule's order (no arc lengths, no chords). Each
face is computed once, from its owner's parametrisation, and used with opposite signs by the two cells,
so the scheme is conservative to round-off. Cell areas are exactly 4 pi / N (the map is equal-area).
"""
from __future__ import annotations

import healpy as hp
from functools import cached_property

import numpy as np

from .._checks import positive_int
from ._healpix_map import FACE_AREA, face_map, face_map_jacobian
from .base import Grid, incidence, least_squares_stencil

__all__ = ["HealpixGrid"]

# healpy get_all_neighbours order: SW, W, NW, N, NE, E, SE, S; edge neighbours are SW, NW, NE, SE.
# For each edge: (index in get_all_neighbours, fixed coordinate, which offset, start/end along tau)
#   SE edge: y = y0,     x from x0 to x0 + h
#   NE edge: x = x0 + h, y from y0 to y0 + h
#   NW edge: y = y0 + h, x from x0 to x0 + h
#   SW edge: x = x0,     y from y0 to y0 + h
_EDGES = ((6, "y", 0), (4, "x", 1), (2, "y", 1), (0, "x", 0))


def _gauss01(n: int):
    t, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * (t + 1.0), 0.5 * w


def _square_rule(order: int, face, x0, y0, h):
    """Cell rule on the face squares [x0, x0 + h] x [y0, y0 + h]: points (n, 2 order^2, 3) and weights
    (2 order^2,) summing to 1 (see :meth:`HealpixGrid._cell_quadrature`)."""
    u, wu = _gauss01(order)
    v, wv = _gauss01(order)
    U, Vv = np.meshgrid(u, v, indexing="ij")
    Wt = (wu[:, None] * u[:, None] * wv[None, :]).ravel()  # Duffy Jacobian u, per triangle
    U, Vv = U.ravel(), Vv.ravel()
    x0 = np.asarray(x0, float)[:, None]
    y0 = np.asarray(y0, float)[:, None]
    h = np.broadcast_to(np.asarray(h, float), x0.shape[:1])[:, None]
    pts = []
    # north triangle: apex N = (x0+h, y0+h), base W = (x0, y0+h) -> E = (x0+h, y0)
    # south triangle: apex S = (x0, y0),     base W = (x0, y0+h) -> E = (x0+h, y0)
    for a in (1.0, 0.0):
        px = (x0 + a * h) + U[None, :] * (Vv[None, :] * h - a * h)
        py = (y0 + a * h) + U[None, :] * ((1 - Vv)[None, :] * h - a * h)
        f = np.broadcast_to(np.asarray(face)[:, None], px.shape)
        pts.append(face_map(f, px, py))
    return np.concatenate(pts, axis=1), np.concatenate([Wt, Wt])


def edge_quadrature(face, x0, y0, h, fixed: str, off: int, edge_points: int, centers):
    """Gauss points and weighted normals of one edge of each listed face square.

    The squares are [x0, x0 + h] x [y0, y0 + h] of base face ``face`` (arrays (n,)); the edge is the lattice
    segment ``fixed`` = "y" (y = y0 + off h, x running) or "x" (x = x0 + off h, y running), mapped exactly by
    the face map. Normals point away from ``centers`` (n, 3) (the owner's centre). Returns (points (n, G, 3),
    weighted normals (n, G, 3), midpoint normal (n, 3), end points (n, 2, 3)). A HEALPix edge and the two
    half edges of its children are pieces of one curve, so a coarse cell's edge is exactly the union of
    the fine sub-faces next to it (:class:`spherepde.grids.adaptive.AdaptiveHealpixGrid`).
    """
    face = np.asarray(face)
    n = len(face)
    tau, w = _gauss01(edge_points)
    x0 = np.asarray(x0, float)[:, None]
    y0 = np.asarray(y0, float)[:, None]
    hh = np.asarray(h, float)[:, None]
    f = face[:, None]
    t, wt = HealpixGrid._edge_rule(face, x0[:, 0], y0[:, 0], fixed, off, hh[:, 0], tau, w)
    t = np.concatenate([t, np.full((n, 1), 0.5), np.zeros((n, 1)), np.ones((n, 1))], axis=1)
    if fixed == "y":
        xs, ys = x0 + hh * t, y0 + off * hh + 0 * t
    else:
        xs, ys = x0 + off * hh + 0 * t, y0 + hh * t
    X, Xx, Xy = face_map_jacobian(np.broadcast_to(f, xs.shape), xs, ys)
    dX = hh[:, :, None] * (Xx if fixed == "y" else Xy)
    W = np.cross(dX, X)  # |W| = |dX/dtau|: the normal line element
    # orient out of the owner
    sgn = np.sign(np.einsum("fk,fk->f", W[:, -3], X[:, -3] - centers))
    W *= sgn[:, None, None]
    return X[:, :-3], W[:, :-3] * wt[:, :, None], W[:, -3], X[:, -2:]


def _set_faces(grid, parts, known=None):
    """Fill a grid's face arrays from a list of :func:`edge_quadrature` results (in face order); one part is
    taken as it is (no copy: the adaptive grid hands over whole arrays at every regrid). ``known``: (rows,
    face lengths, unit normals) already computed for those rows (the faces an adaptive grid kept across a
    regrid); the other rows' are computed, row by row the same bits."""
    def cat(k):
        return parts[0][k] if len(parts) == 1 else np.concatenate([p[k] for p in parts])

    grid.face_points = np.ascontiguousarray(cat(0))
    grid.face_normals = np.ascontiguousarray(cat(1))
    grid.face_weights = _gauss01(grid.edge_points)[1]
    grid.face_ends = cat(3)  # (F, 2, 3) the edge's end points (pixel corners)
    mid = cat(2)
    if known is None:
        grid.face_length = np.linalg.norm(grid.face_normals, axis=2).sum(axis=1)
        grid.face_unit_normal = mid / np.linalg.norm(mid, axis=1, keepdims=True)
        return
    rows, length, unit = known
    todo = np.ones(len(mid), bool)
    todo[rows] = False
    grid.face_length = np.empty(len(mid))
    grid.face_unit_normal = np.empty_like(mid)
    grid.face_length[rows], grid.face_unit_normal[rows] = length, unit
    grid.face_length[todo] = np.linalg.norm(grid.face_normals[todo], axis=2).sum(axis=1)
    grid.face_unit_normal[todo] = mid[todo] / np.linalg.norm(mid[todo], axis=1, keepdims=True)


class HealpixGrid(Grid):
    """The HEALPix tessellation of S^2 at resolution ``nside`` (N = 12 nside^2 cells, RING order).

    Parameters
    ----------
    nside : int
        Any integer >= 1 (RING order does not need a power of two).
    edge_points : int, default 6
        Gauss points per pixel edge (graded towards the poles in the polar caps, see ``_edge_rule``).
        Measured discrete divergence of a rigid rotation (exactly 0) at nside 64: 1e-2 with 2 points,
        2.4e-6 with 4, 2e-10 with 6 (worst cell, next to a pole; elsewhere round-off).
    cell_order : int, default 4
        Gauss order per direction of the cell quadrature (2 Duffy-collapsed triangles per pixel,
        2 * cell_order^2 points): used for ``xbar`` and as the default of :meth:`cell_average`.

    Attributes
    ----------
    centers : (N, 3) pixel centres (healpy ``pix2vec``). areas : (N,) all equal to 4 pi / N.
    xbar : (N, 3) cell mean positions. owner, neighbour : (2N,) the two cells of each face.
    face_points, face_normals : (2N, G, 3) Gauss points and weighted outward (from owner) normals.
    face_length : (2N,) edge lengths; face_unit_normal : (2N, 3) unit normal at the edge midpoint.
    """

    dim = 3

    def __init__(self, nside: int, edge_points: int = 6, cell_order: int = 4):
        self.nside = positive_int(nside, "nside", minimum=1)
        self.edge_points = positive_int(edge_points, "edge_points", minimum=1)
        self.cell_order = positive_int(cell_order, "cell_order", minimum=1)
        ns = self.nside
        N = 12 * ns * ns
        pix = np.arange(N)
        self.centers = np.array(hp.pix2vec(ns, pix)).T.copy()
        self.areas = np.full(N, 4.0 * np.pi / N)
        ix, iy, face = hp.pix2xyf(ns, pix)
        self._ix, self._iy, self._face = ix, iy, face
        self._build_faces()
        self.cell_points, self.cell_weights = self._cell_quadrature(self.cell_order)
        self.xbar = np.einsum("nqd,q->nd", self.cell_points, self.cell_weights)
        nbrs = hp.get_all_neighbours(ns, pix).T  # (N, 8), -1 where absent (corners only)
        self.stencil = np.where(nbrs >= 0, nbrs, pix[:, None]).astype(np.int32)
        self.stencil_coef_local, self.tangent_basis = least_squares_stencil(self.xbar, nbrs)

    def __repr__(self):
        return f"HealpixGrid(nside={self.nside}, n_cells={self.n_cells})"

    @cached_property
    def error_blocks(self) -> np.ndarray:
        """2 x 2 blocks of the base-face lattice (the NESTED parents where nside is a power of 2); see
        :attr:`Grid.error_blocks`."""
        m = (self.nside + 1) // 2
        return ((self._face * m + self._ix // 2) * m + self._iy // 2).astype(np.int64)

    # ------------------------------------------------------------------ faces
    def _build_faces(self):
        ns = self.nside
        N = 12 * ns * ns
        pix = np.arange(N)
        h = 1.0 / ns
        nbrs = hp.get_all_neighbours(ns, pix)  # (8, N)
        owners, neighs, parts = [], [], []
        for k, fixed, off in _EDGES:
            q = nbrs[k]
            if np.any(q < 0):  # pragma: no cover - healpy guarantees edge neighbours exist
                raise RuntimeError("HEALPix edge neighbour missing")
            keep = pix < q
            p = pix[keep]
            parts.append(edge_quadrature(self._face[p], self._ix[p] * h, self._iy[p] * h, np.full(len(p), h),
                                         fixed, off, self.edge_points, self.centers[p]))
            owners.append(p)
            neighs.append(q[keep])
        self.owner = np.concatenate(owners).astype(np.int32)
        self.neighbour = np.concatenate(neighs).astype(np.int32)
        _set_faces(self, parts)
        self.cell_faces, self.cell_face_sign, count = incidence(self.owner, self.neighbour, N, 4)
        if np.any(count != 4):  # pragma: no cover
            raise RuntimeError("every HEALPix pixel must have exactly four edge neighbours")

    @staticmethod
    def _edge_rule(face, x0, y0, fixed, off, h, tau, w):
        """Per-edge Gauss nodes (n, G) in tau in [0, 1] and weights (n, G).

        On the equatorial belt the face map is analytic and plain Gauss-Legendre in tau is used. In the
        polar caps, along every edge nr (the distance-to-pole ring coordinate, linear in tau) runs over
        [a, a + h], and the map has a 1/nr singularity at nr = 0, only one edge-length away for the first
        rings: plain Gauss then loses a fixed relative accuracy per edge (a divergence error growing like
        nside). There we integrate in sigma with nr = a (b/a)^sigma, which moves the singularity to
        sigma = -infinity (geometric grading towards the pole). Edges that end at the pole (a = 0) are
        meridians, analytic in nr, and keep plain Gauss.
        """
        from ._healpix_map import _JRLL

        n = len(face)
        if fixed == "y":
            xs, ys = np.stack([x0, x0 + h], 1), np.stack([y0 + off * h] * 2, 1)
        else:
            xs, ys = np.stack([x0 + off * h] * 2, 1), np.stack([y0, y0 + h], 1)
        jr = _JRLL[face][:, None] - xs - ys  # (n, 2) at tau = 0, 1
        north = np.all(jr <= 1.0, axis=1)
        south = np.all(jr >= 3.0, axis=1)
        nr = np.where(north[:, None], jr, 4.0 - jr)
        a, b = nr.min(axis=1), nr.max(axis=1)
        graded = (north | south) & (a > 0.5 * h)
        T = np.broadcast_to(tau, (n, len(tau))).copy()
        Wt = np.broadcast_to(w, (n, len(w))).copy()
        if np.any(graded):
            ag, bg = a[graded][:, None], b[graded][:, None]
            ratio = np.log(bg / ag)
            nr_g = ag * np.exp(ratio * tau[None, :])
            n0, n1 = nr[graded, 0][:, None], nr[graded, 1][:, None]
            T[graded] = (nr_g - n0) / (n1 - n0)
            Wt[graded] = w[None, :] * nr_g * ratio / (bg - ag)
        return T, Wt

    # ------------------------------------------------------------ quadrature
    def _cell_quadrature(self, order: int, cells=None):
        """Quadrature points (n, 2 order^2, 3) and weights (2 order^2,) summing to 1 per cell.

        Each pixel is split along its W-E diagonal (where the face map is only C^0, at z = +-2/3) into a
        north and a south triangle; each triangle gets a Gauss rule Duffy-collapsed at its N (resp. S)
        vertex, the pole for polar pixels, where the face map is singular. The map is equal-area, so
        parameter-space weights are area weights.
        """
        if cells is None:
            cells = np.arange(self.n_cells)
        h = 1.0 / self.nside
        return _square_rule(order, self._face[cells], self._ix[cells] * h, self._iy[cells] * h, h)

    # Sub-cells of the adaptive cell averages (see Grid._adaptive_average): a row (face, x0, y0, h) is the
    # square [x0, x0 + h] x [y0, y0 + h] of a base face, whose four quarters are exact sub-cells (the
    # NESTED children where nside is a power of 2), of area FACE_AREA h^2 (the face map is equal-area).
    def _sub_roots(self):
        h = 1.0 / self.nside
        desc = np.stack([self._face, self._ix * h, self._iy * h, np.full(self.n_cells, h)], axis=1)
        return desc.astype(float), np.arange(self.n_cells)

    def _sub_rule(self, desc, order: int, root: bool = False):
        if root and order == self.cell_order and desc.shape[0] == self.n_cells:
            pts, w = self.cell_points, self.cell_weights
        else:
            pts, w = _square_rule(order, desc[:, 0].astype(np.int64), desc[:, 1], desc[:, 2], desc[:, 3])
        return pts, w[None, :] * (FACE_AREA * desc[:, 3] ** 2)[:, None]

    @staticmethod
    def _sub_children(desc):
        n = desc.shape[0]
        half = 0.5 * desc[:, 3]
        kids = np.repeat(desc, 4, axis=0)
        kids[:, 1] += np.tile([0.0, 1.0, 0.0, 1.0], n) * np.repeat(half, 4)
        kids[:, 2] += np.tile([0.0, 0.0, 1.0, 1.0], n) * np.repeat(half, 4)
        kids[:, 3] = np.repeat(half, 4)
        return kids, np.repeat(np.arange(n), 4)

    @staticmethod
    def _sub_ball(desc):
        f = desc[:, 0].astype(np.int64)
        x0, y0, h = desc[:, 1], desc[:, 2], desc[:, 3]
        c = face_map(f, x0 + 0.5 * h, y0 + 0.5 * h)
        r = np.zeros(len(f))
        for ox, oy in ((0, 0), (1, 0), (0, 1), (1, 1), (0.5, 0), (0, 0.5), (1, 0.5), (0.5, 1)):
            r = np.maximum(r, np.linalg.norm(face_map(f, x0 + ox * h, y0 + oy * h) - c, axis=1))
        return c, 1.5 * r  # the edges are curved: a margin over the corner and edge-midpoint distances

    def cell_average(self, func, order: int | None = None, chunk: int = 65536, *, rtol: float | None = None,
                     features=None, info: bool = False):
        """Cell averages (1/|C_i|) int_{C_i} func dA of ``func(x) -> (n,)`` by sub-pixel quadrature.

        Parameters
        ----------
        func : callable taking unit vectors (n, 3) and returning (n,) values.
        order : int, optional
            Gauss order per direction on each of the two triangles of a pixel (default: the grid's
            ``cell_order``, 32 points per pixel). The error is far below the scheme's for smooth
            ``func`` (see tests/test_healpix.py).
        rtol : float, optional
            Adaptive quadrature to this relative accuracy of the total (for ``func`` with features
            below the pixel size, e.g. a narrow vMF density): pixels whose values vary strongly are
            split into their four sub-pixels (exact sub-cells in face coordinates), recursively, until
            the rule agrees with its children's sum (see ``Grid._adaptive_average``).
        features : list of (point, width), optional
            With ``rtol``: where ``func`` has structure of angular size ``width`` (a vMF mean and
            1 / sqrt(kappa)); pieces wider than that near the point are always refined, since the
            rule's nodes could miss the feature and its error estimate with them.
        info : bool, default False
            With ``rtol``: also return the dict of the refinement (tested cells, pieces, levels,
            estimated relative error, converged).
        """
        order = self.cell_order if order is None else positive_int(order, "order")
        if rtol is not None:
            avg, inf = self._adaptive_average(func, order, float(rtol), features)
            return (avg, inf) if info else avg
        out = np.empty(self.n_cells)
        for start in range(0, self.n_cells, chunk):
            cells = np.arange(start, min(start + chunk, self.n_cells))
            if order == self.cell_order:
                pts, w = self.cell_points[cells], self.cell_weights
            else:
                pts, w = self._cell_quadrature(order, cells)
            vals = np.asarray(func(pts.reshape(-1, 3)), float).reshape(pts.shape[:2])
            out[cells] = vals @ w
        if not np.all(np.isfinite(out)):
            raise ValueError("func returned NaN or inf at some quadrature points")
        return out

    def sample_in_cells(self, cells, rng=None) -> np.ndarray:
        """One uniform point in each listed cell (exact: the face map is equal-area); shape (n, 3)."""
        rng = np.random.default_rng(rng)
        cells = np.asarray(cells, dtype=np.int64)
        if cells.size and (cells.min() < 0 or cells.max() >= self.n_cells):
            raise ValueError(f"cells must be in [0, {self.n_cells}), got range [{cells.min()}, {cells.max()}]")
        h = 1.0 / self.nside
        x = (self._ix[cells] + rng.random(cells.size)) * h
        y = (self._iy[cells] + rng.random(cells.size)) * h
        return face_map(self._face[cells], x, y)

    def cell_of(self, points) -> np.ndarray:
        """Index of the cell containing each point (n, 3)."""
        p = np.asarray(points, float)
        return hp.vec2pix(self.nside, p[:, 0], p[:, 1], p[:, 2])
