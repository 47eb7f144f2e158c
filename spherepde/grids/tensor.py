r"""Tensor grids of S^(d-1) in hyperspherical angles (d = 2, 3, 4, and any d >= 2), optionally reduced.

Coordinates: polar angles psi_1, ..., psi_{d-2} in [0, pi] and the periodic angle phi in [0, 2 pi),

    x_d = cos psi_1, x_{d-1} = sin psi_1 cos psi_2, ..., x_1 = s cos phi, x_2 = s sin phi,
    s = sin psi_1 ... sin psi_{d-2}

(d = 2: x = (cos phi, sin phi); d = 3: theta = psi_1, x = (sin theta cos phi, sin theta sin phi,
cos theta); d = 4: chi = psi_1, theta = psi_2). The coordinates are orthogonal with metric factors
h_1 = 1, h_k = sin psi_1 ... sin psi_{k-1}, h_phi = s, and volume element

    J = prod_k h_k = sin^{d-2} psi_1 sin^{d-3} psi_2 ... sin psi_{d-2}.

Cells are boxes in the angles. A cell's volume is the product of one-dimensional integrals
int sin^m (closed form), so cell volumes are exact and sum to |S^(d-1)| (2 pi, 4 pi, 2 pi^2). A face
psi_k = c between two boxes is the box of the other angles where both cells overlap; its area element
is J / h_k and its unit normal is e_k = (dx/dpsi_k) / h_k. Faces carry a tensor-product Gauss rule in
the other d - 2 angles: points X_g and weighted normals W_g = w_g (J / h_k)(X_g) e_k(X_g), so that
sum_g u(X_g) . W_g -> int_face u . n dS (for d = 2 a face is a point: G = 1, W = e_phi). Faces at
psi_k = 0 or pi have zero area and no neighbour: they are not listed.

Reduced grid (default). On the plain tensor grid a cell's extent along angle k is h_k times its angle
width, so cells next to a pole are thin slivers and the outflow Courant number of the worst cell, hence
the time step, degrades like 1/n per thin direction. The reduced grid coarsens angle k (k >= 2, phi
included) in each box of the earlier angles by the largest power of two 2^q with
2^q <= 1 / h_k(box centre) (and dividing the count, and leaving at least ``min_count`` cells), so every
cell has physical widths between about half and one base width. Cells then have several neighbours
across a face of an earlier angle; the face lists handle that (a face is an (owner, neighbour) pair with
its own box and Gauss points). Measured cost of not reducing: see ``validation/convergence_tensor``.

Implementation: the base lattice (counts ``counts`` per angle, the unreduced grid) is built first; every
lattice box belongs to one cell; faces are the lattice faces between different cells, grouped by cell
pair; stencil neighbours are the cells of the lattice boxes that touch a cell's boxes (faces and
corners, 3^(d-1) - 1 lattice offsets).
"""
from __future__ import annotations

import math

from functools import cached_property

import numpy as np

from .._checks import as_points, positive_int
from .base import Grid, incidence, least_squares_stencil

__all__ = ["TensorGrid", "sphere_area", "sin_power_integral", "embed", "to_angles", "unit_tangent"]


def sphere_area(d: int) -> float:
    """|S^(d-1)| = 2 pi^(d/2) / Gamma(d/2)."""
    return 2.0 * math.pi ** (d / 2) / math.gamma(d / 2)


def sin_power_integral(m: int, a, b):
    """int_a^b sin^m(t) dt, closed form (recursion I_m = [-sin^(m-1) cos / m] + (m-1)/m I_(m-2))."""
    a = np.asarray(a, float)
    b = np.asarray(b, float)
    if m == 0:
        return b - a
    if m == 1:
        return np.cos(a) - np.cos(b)
    bound = (-(np.sin(b) ** (m - 1)) * np.cos(b) + np.sin(a) ** (m - 1) * np.cos(a)) / m
    return bound + (m - 1) / m * sin_power_integral(m - 2, a, b)


def embed(angles, deriv: int | None = None) -> np.ndarray:
    """Points x (n, d) from angles (n, d-1) = (psi_1, ..., psi_{d-2}, phi).

    With ``deriv = k`` returns instead the unit tangent e_k = (dx / d angle_k) / h_k.
    """
    ang = np.asarray(angles, float)
    n, m = ang.shape
    d = m + 1
    x = np.zeros((n, d))
    s = np.ones(n)
    for j in range(d - 2):
        if deriv is not None and j < deriv:
            continue  # these components do not depend on angle k; h_k's factors are dropped
        c, sn = np.cos(ang[:, j]), np.sin(ang[:, j])
        if j == deriv:
            c, sn = -sn, c
        x[:, d - 1 - j] = s * c
        s = s * sn
    c, sn = np.cos(ang[:, -1]), np.sin(ang[:, -1])
    if deriv == d - 2:
        c, sn = -sn, c
    x[:, 0] = s * c
    x[:, 1] = s * sn
    return x


def unit_tangent(angles, k: int) -> np.ndarray:
    """e_k at the given angles, shape (n, d)."""
    return embed(angles, deriv=k)


def to_angles(points) -> np.ndarray:
    """Angles (n, d-1) of unit points (n, d): the inverse of :func:`embed` (phi in [0, 2 pi))."""
    x = np.asarray(points, float)
    n, d = x.shape
    ang = np.empty((n, d - 1))
    for j in range(d - 2):
        # psi_{j+1} = angle between x_{d-1-j} and the norm of the components below it
        rest = np.linalg.norm(x[:, : d - 1 - j], axis=1)
        ang[:, j] = np.arctan2(rest, x[:, d - 1 - j])
    ang[:, -1] = np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * np.pi)
    return ang


def _gauss01(n: int):
    t, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * (t + 1.0), 0.5 * w


def _sin_exponents(d: int, k: int | None = None) -> list[int]:
    """Exponents of sin(psi_j) in J (k None) or in J / h_k (the face element of angle k)."""
    return [(d - 2 - j) - (1 if (k is not None and j < k) else 0) for j in range(d - 2)]



def _subdivide(lo, hi, pieces):
    """Boxes lo, hi (n, m) cut into pieces[i, j] equal parts along angle j: (parent index, sub lo, sub hi),
    the sub-boxes of each box consecutive, the last part of each angle ending exactly on hi."""
    m = lo.shape[1]
    total = np.prod(pieces, axis=1)
    rep = np.repeat(np.arange(len(total)), total)
    local = np.arange(rep.size) - np.repeat(np.cumsum(total) - total, total)
    sub_lo, sub_hi = np.empty((rep.size, m)), np.empty((rep.size, m))
    for j in range(m - 1, -1, -1):
        pj = pieces[rep, j]
        ij = local % pj
        local = local // pj
        wj = (hi[rep, j] - lo[rep, j]) / pj
        sub_lo[:, j] = lo[rep, j] + ij * wj
        sub_hi[:, j] = np.where(ij == pj - 1, hi[rep, j], lo[rep, j] + (ij + 1) * wj)
    return rep, sub_lo, sub_hi

class TensorGrid(Grid):
    """Cells that are boxes in hyperspherical angles on S^(d-1).

    Parameters
    ----------
    d : int >= 2
        Ambient dimension (S^1, S^2, S^3 for d = 2, 3, 4; the kernels support d <= 4).
    n : int or sequence of d - 1 ints
        Cells per angle of the base (unreduced) lattice. An int n means n per polar angle and 2 n for phi
        (so cells are about pi / n wide in every direction); a sequence gives (n_psi1, ..., n_phi).
    reduced : bool, default True
        Coarsen angles near the poles (module docstring) so that no cell is much thinner than the base
        width. False gives the plain tensor grid.
    face_order : int, default 3
        Gauss points per angle on a face (G = face_order^(d-2) points per face). Measured on S^3 at
        n = 32: the discrete divergence of a rigid rotation (exactly 0) is 7e-3 with 2 points (in the
        wide pole faces) and 1e-5 with 3; on S^2 3.6e-4 and 1.2e-7 at n = 128.
    split_width : float, default pi / 8
        Faces and cell-quadrature boxes wider than max(base width, split_width) in an angle are split
        into pieces (several face entries for one cell pair) so that the Gauss rules stay accurate on
        the wide reduced cells next to a pole.
    cell_order : int, default 3
        Gauss points per angle of the cell quadrature (``xbar`` and the default of :meth:`cell_average`).
    min_count : int, default 4
        Fewest cells a reduced angle keeps in a box of the earlier angles (phi); polar angles keep at
        least 2.

    Attributes
    ----------
    centers : (N, d) images of the box centres. areas : (N,) exact volumes. xbar : (N, d) mean positions.
    lo, hi : (N, d-1) the cells' angle boxes. owner, neighbour : (F,) the two cells of each face (the
    neighbour on the side of increasing angle). face_points, face_normals : (F, G, d). face_axis : (F,)
    the angle k normal to each face. face_length : (F,) exact face measures (closed form).
    """

    def __init__(self, d: int, n, reduced: bool = True, face_order: int = 3, cell_order: int = 3,
                 min_count: int = 4, split_width: float = np.pi / 8):
        self.dim = positive_int(d, "d", minimum=2)
        d = self.dim
        from ..kernels.fv import MAX_DIM

        if d > MAX_DIM:
            raise ValueError(f"d must be an integer in 2..{MAX_DIM} (S^1 to S^{MAX_DIM - 1}: the finite-volume "
                             f"kernels' limit), got {d}")
        if np.ndim(n) == 0:
            n = positive_int(int(n) if isinstance(n, (np.integer,)) else n, "n")
            counts = [n] * (d - 2) + [2 * n]
        else:
            counts = [positive_int(int(c), "n[k]") for c in n]
            if len(counts) != d - 1:
                raise ValueError(f"n must be an int or {d - 1} counts (one per angle), got {len(counts)}")
        if counts[-1] < 3:
            raise ValueError(f"the periodic angle needs at least 3 cells, got {counts[-1]}")
        self.counts = tuple(counts)
        self.reduced = bool(reduced)
        self.face_order = positive_int(face_order, "face_order")
        self.cell_order = positive_int(cell_order, "cell_order")
        self.min_count = positive_int(min_count, "min_count", minimum=3)
        self.split_width = float(split_width)
        if not (0 < self.split_width <= 2 * np.pi):
            raise ValueError(f"split_width must be in (0, 2 pi], got {split_width}")
        self._edges = [np.linspace(0.0, np.pi, c + 1) for c in counts[:-1]]
        self._edges.append(np.linspace(0.0, 2 * np.pi, counts[-1] + 1))
        self._build_cells()
        self._build_faces()
        self._build_stencil()

    def __repr__(self):
        return (f"TensorGrid(d={self.dim}, counts={self.counts}, reduced={self.reduced}, "
                f"n_cells={self.n_cells}, n_faces={self.n_faces})")

    # ------------------------------------------------------------------ cells
    def _angle(self, k: int, idx):
        """Angle of lattice node ``idx`` (may be fractional) along angle k."""
        width = (2 * np.pi if k == self.dim - 2 else np.pi) / self.counts[k]
        return np.asarray(idx, float) * width

    def _build_cells(self):
        d, counts = self.dim, self.counts
        m = d - 1
        fine = np.indices(counts).reshape(m, -1).T  # (P, m) lattice boxes, C order
        P = fine.shape[0]
        key = np.zeros((P, 2 * m), dtype=np.int64)
        lo = np.zeros((P, m), dtype=np.int64)
        hi = np.zeros((P, m), dtype=np.int64)
        metric = np.ones(P)  # h_k at the centre of the (coarse) box of the earlier angles
        for k in range(m):
            q = np.zeros(P, dtype=np.int64)
            if self.reduced and k >= 1:
                floor = self.min_count if k == m - 1 else 2
                qmax = 0
                while counts[k] % 2 ** (qmax + 1) == 0 and counts[k] // 2 ** (qmax + 1) >= floor:
                    qmax += 1
                with np.errstate(divide="ignore"):
                    q = np.floor(np.log2(1.0 / np.maximum(metric, 1e-300))).astype(np.int64)
                q = np.clip(q, 0, qmax)
            c = fine[:, k] >> q
            key[:, 2 * k] = q
            key[:, 2 * k + 1] = c
            lo[:, k] = c << q
            hi[:, k] = (c + 1) << q
            if k < m - 1:
                metric = metric * np.sin(self._angle(k, 0.5 * (lo[:, k] + hi[:, k])))
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
        self._lattice_cell = inverse.reshape(-1).astype(np.int64)  # lattice box -> cell
        self._lo_idx = lo[first]
        self._hi_idx = hi[first]
        self.lo = np.stack([self._angle(k, self._lo_idx[:, k]) for k in range(m)], axis=1)
        self.hi = np.stack([self._angle(k, self._hi_idx[:, k]) for k in range(m)], axis=1)
        N = self.lo.shape[0]
        areas = np.ones(N)
        for j, e in enumerate(_sin_exponents(d)):
            areas *= sin_power_integral(e, self.lo[:, j], self.hi[:, j])
        areas *= self.hi[:, -1] - self.lo[:, -1]
        self.areas = areas
        self.centers = embed(0.5 * (self.lo + self.hi))
        pts, w, own = self._cell_quadrature(self.cell_order, np.arange(N))
        vol = np.bincount(own, w, minlength=N)
        self.xbar = np.stack([np.bincount(own, w * pts[:, c], minlength=N) for c in range(d)], axis=1) / vol[:, None]

    @cached_property
    def circle_start(self) -> float | None:
        """phi_0 when this is S^1 cut into equal cells in order (cell j at phi_0 + 2 pi j / N), else None
        (see :attr:`Grid.circle_start`)."""
        if self.dim != 2:
            return None
        phi = 0.5 * (self.lo[:, 0] + self.hi[:, 0])
        if np.allclose(np.diff(phi), 2 * np.pi / len(phi), rtol=0, atol=1e-12):
            return float(phi[0])
        return None

    @cached_property
    def cell_moments2(self) -> np.ndarray:
        """(N, d, d) central second moments of the cells, from the cell quadrature that gives ``xbar``."""
        N, d = self.n_cells, self.dim
        pts, w, own = self._cell_quadrature(self.cell_order, np.arange(N))
        off = pts - self.xbar[own]
        vol = np.bincount(own, w, minlength=N)
        out = np.empty((N, d, d))
        for a in range(d):
            for b in range(a, d):
                out[:, a, b] = out[:, b, a] = np.bincount(own, w * off[:, a] * off[:, b], minlength=N) / vol
        return out

    def _box_rule(self, lo, hi, order: int, exponents):
        """Tensor Gauss rule on boxes lo, hi (n, m): angles (n, Q, m) and weights (n, Q) including
        prod_j sin^{exponents[j]}(angle_j) (exponents for the polar angles; the last angle has none
        if len(exponents) < m)."""
        n, m = lo.shape
        t, w = _gauss01(order)
        grids = np.meshgrid(*([t] * m), indexing="ij")
        T = np.stack([g.ravel() for g in grids], axis=1)  # (Q, m)
        Wq = np.prod(np.stack(np.meshgrid(*([w] * m), indexing="ij"), 0).reshape(m, -1), axis=0)
        ang = lo[:, None, :] + T[None, :, :] * (hi - lo)[:, None, :]
        wt = Wq[None, :] * np.prod(hi - lo, axis=1)[:, None]
        for j, e in enumerate(exponents):
            if e:
                wt = wt * np.sin(ang[:, :, j]) ** e
        return ang, wt

    def _split_boxes(self, lo, hi, fixed=None):
        """Split boxes (n, m) into sub-boxes no wider than max(base width, split_width) per angle
        (never along angle ``fixed[i]`` of box i). Returns (parent index, sub lo, sub hi)."""
        m = lo.shape[1]
        base = np.array([(2 * np.pi if k == m - 1 else np.pi) / c for k, c in enumerate(self.counts)])
        wmax = np.maximum(base, self.split_width) * (1 + 1e-9)
        pieces = np.maximum(1, np.ceil((hi - lo) / wmax).astype(np.int64))
        if fixed is not None:
            pieces[np.arange(len(pieces)), fixed] = 1
        return _subdivide(lo, hi, pieces)

    def _cell_quadrature(self, order: int, cells):
        """Points (P, d), volume weights (P,) and owning cell (P,) of a Gauss rule on the listed cells
        (``order`` points per angle on each sub-box of the cell, see :meth:`_split_boxes`)."""
        rep, lo, hi = self._split_boxes(self.lo[cells], self.hi[cells])
        ang, wt = self._box_rule(lo, hi, order, _sin_exponents(self.dim))
        n, Q, m = ang.shape
        owner = np.repeat(rep, Q)
        return embed(ang.reshape(-1, m)), wt.reshape(-1), owner

    def cell_average(self, func, order: int | None = None, chunk: int = 1 << 20, *, rtol: float | None = None,
                     features=None, info: bool = False):
        """Cell averages (1/|C_i|) int_{C_i} func dV of ``func(x) -> (n,)``.

        Tensor Gauss-Legendre in the angles with the exact volume element (``order`` points per angle,
        default ``cell_order``, on sub-boxes no wider than max(base width, split_width)), normalised by
        the rule's own volume so constants are exact. The error is O(h^(2 order)), far below the
        scheme's for smooth ``func``.

        With ``rtol``: adaptive quadrature, the boxes whose values vary strongly split into half-boxes
        (along the angles of largest physical extent), recursively, until the rule agrees with its children's sum;
        ``features`` and ``info`` as in :meth:`spherepde.grids.healpix.HealpixGrid.cell_average`.
        """
        order = self.cell_order if order is None else positive_int(order, "order")
        if rtol is not None:
            avg, inf = self._adaptive_average(func, order, float(rtol), features)
            return (avg, inf) if info else avg
        N = self.n_cells
        per = max(1, chunk // order ** (self.dim - 1))
        out = np.empty(N)
        for start in range(0, N, per):
            cells = np.arange(start, min(start + per, N))
            pts, w, own = self._cell_quadrature(order, cells)
            vals = np.asarray(func(pts), float).reshape(-1)
            out[cells] = (np.bincount(own, w * vals, minlength=cells.size)
                          / np.bincount(own, w, minlength=cells.size))
        if not np.all(np.isfinite(out)):
            raise ValueError("func returned NaN or inf at some quadrature points")
        return out

    # Sub-cells of the adaptive cell averages (see Grid._adaptive_average): a row (lo, hi) is a box in
    # the angles; its half-boxes (halved along its physically widest angles) are exact sub-cells.
    def _sub_roots(self):
        rep, lo, hi = self._split_boxes(self.lo, self.hi)
        return np.concatenate([lo, hi], axis=1), rep

    def _sub_rule(self, desc, order: int, root: bool = False):
        m = self.dim - 1
        ang, wt = self._box_rule(desc[:, :m], desc[:, m:], order, _sin_exponents(self.dim))
        n, Q, _ = ang.shape
        return embed(ang.reshape(-1, m)).reshape(n, Q, self.dim), wt

    def _sub_children(self, desc):
        # halve only the angles whose physical extent (angle width x metric factor) is at least half the
        # largest: a box at a pole is a thin wedge in phi, and halving phi there would not shrink it
        m = self.dim - 1
        lo, hi = desc[:, :m], desc[:, m:]
        smax = np.where((lo <= 0.5 * np.pi) & (hi >= 0.5 * np.pi), 1.0, np.maximum(np.sin(lo), np.sin(hi)))
        metric = np.ones_like(lo)
        for j in range(1, m):
            metric[:, j] = metric[:, j - 1] * smax[:, j - 1]
        ext = (hi - lo) * metric
        pieces = np.where(ext >= 0.5 * ext.max(axis=1, keepdims=True), 2, 1)
        rep, klo, khi = _subdivide(lo, hi, pieces)
        return np.concatenate([klo, khi], axis=1), rep

    def _sub_ball(self, desc):
        m = self.dim - 1
        lo, hi = desc[:, :m], desc[:, m:]
        c = embed(0.5 * (lo + hi))
        r = np.zeros(desc.shape[0])
        for t in np.array(np.meshgrid(*([[0.0, 0.5, 1.0]] * m), indexing="ij")).reshape(m, -1).T:
            r = np.maximum(r, np.linalg.norm(embed(lo + t * (hi - lo)) - c, axis=1))
        return c, 1.5 * r  # margin: the box's faces are curved

    # ------------------------------------------------------------------ faces
    def _lattice_neighbour(self, fine_flat, k: int, step: int):
        """Flat index of the lattice box one step along angle k (periodic in phi; -1 off the range)."""
        counts = self.counts
        idx = np.array(np.unravel_index(fine_flat, counts))
        idx[k] += step
        if k == len(counts) - 1:
            idx[k] %= counts[k]
            ok = np.ones(fine_flat.shape, bool)
        else:
            ok = (idx[k] >= 0) & (idx[k] < counts[k])
            idx[k] = np.clip(idx[k], 0, counts[k] - 1)
        return np.where(ok, np.ravel_multi_index(tuple(idx), counts), -1)

    def _build_faces(self):
        d, counts = self.dim, self.counts
        m = d - 1
        P = int(np.prod(counts))
        cell = self._lattice_cell
        fine = np.arange(P)
        owners, neighs, axes, pos = [], [], [], []
        for k in range(m):
            nb = self._lattice_neighbour(fine, k, +1)
            a = cell[fine]
            b = np.where(nb >= 0, cell[np.maximum(nb, 0)], -1)
            keep = (nb >= 0) & (a != b)
            kidx = np.unravel_index(fine[keep], counts)[k] + 1  # lattice position of the face plane
            key = np.stack([a[keep], b[keep], kidx], axis=1)
            key = np.unique(key, axis=0)
            owners.append(key[:, 0])
            neighs.append(key[:, 1])
            pos.append(key[:, 2])
            axes.append(np.full(len(key), k))
        self.owner = np.concatenate(owners).astype(np.int64)
        self.neighbour = np.concatenate(neighs).astype(np.int64)
        self.face_axis = np.concatenate(axes).astype(np.int64)
        face_pos = np.concatenate(pos)
        # face boxes: overlap of the two cells in the other angles, the plane value along the face angle
        lo = np.maximum(self.lo[self.owner], self.lo[self.neighbour])
        hi = np.minimum(self.hi[self.owner], self.hi[self.neighbour])
        # split faces that are wide in some angle (reduced cells near a pole) into pieces no wider than
        # max(base width, split_width): the integrand is smooth in the angles but varies O(1) over an
        # O(1) angle range, and a pole cell's volume is small, so its flux needs the finer rule.
        rep, lo, hi = self._split_boxes(lo, hi, fixed=self.face_axis)
        self.owner, self.neighbour, self.face_axis = self.owner[rep], self.neighbour[rep], self.face_axis[rep]
        face_pos = face_pos[rep]
        F = self.owner.shape[0]
        Gk = self.face_order
        G = Gk ** (d - 2)
        pts = np.empty((F, G, d))
        nrm = np.empty((F, G, d))
        length = np.empty(F)
        centre = np.empty((F, d))
        for k in range(m):
            sel = np.flatnonzero(self.face_axis == k)
            if not sel.size:
                continue
            plane = self._angle(k, face_pos[sel])
            others = [j for j in range(m) if j != k]
            exps = _sin_exponents(d, k)
            if others:
                oexp = [exps[j] if j < d - 2 else 0 for j in others]
                ang_o, wt = self._box_rule(lo[sel][:, others], hi[sel][:, others], Gk, oexp)
            else:
                ang_o, wt = np.zeros((sel.size, 1, 0)), np.ones((sel.size, 1))
            ang = np.empty(ang_o.shape[:2] + (m,))
            ang[:, :, others] = ang_o
            ang[:, :, k] = plane[:, None]
            if k < d - 2 and exps[k]:
                wt = wt * np.sin(plane)[:, None] ** exps[k]
            flat = ang.reshape(-1, m)
            pts[sel] = embed(flat).reshape(sel.size, G, d)
            nrm[sel] = (unit_tangent(flat, k) * wt.reshape(-1)[:, None]).reshape(sel.size, G, d)
            # exact face measure
            meas = np.ones(sel.size)
            for j in others:
                if j < d - 2:
                    meas *= sin_power_integral(exps[j], lo[sel, j], hi[sel, j])
                else:
                    meas *= hi[sel, j] - lo[sel, j]
            if k < d - 2:
                meas *= np.sin(plane) ** exps[k]
            length[sel] = meas
            mid = np.empty((sel.size, m))
            mid[:, others] = 0.5 * (lo[sel][:, others] + hi[sel][:, others])
            mid[:, k] = plane
            centre[sel] = unit_tangent(mid, k)
        self.face_points = np.ascontiguousarray(pts)
        self.face_normals = np.ascontiguousarray(nrm)
        self.face_weights = _gauss01(Gk)[1]
        self.face_length = length
        self.face_unit_normal = centre
        count = np.bincount(self.owner, minlength=self.n_cells) + np.bincount(self.neighbour, minlength=self.n_cells)
        self.cell_faces, self.cell_face_sign, _ = incidence(self.owner, self.neighbour, self.n_cells,
                                                            int(count.max()))

    def _build_stencil(self):
        """Neighbours: cells of the lattice boxes touching a cell's boxes (faces and corners)."""
        counts = self.counts
        m = len(counts)
        P = int(np.prod(counts))
        cell = self._lattice_cell
        fine = np.arange(P)
        pairs = []
        for off in np.ndindex(*([3] * m)):
            off = np.array(off) - 1
            if not off.any():
                continue
            nb = fine
            for k in range(m):
                if off[k]:
                    nb = np.where(nb >= 0, self._lattice_neighbour(np.maximum(nb, 0), k, int(off[k])), -1)
            ok = nb >= 0
            a, b = cell[fine[ok]], cell[nb[ok]]
            diff = a != b
            pairs.append(np.unique(a[diff] * self.n_cells + b[diff]))
        pairs = np.unique(np.concatenate(pairs))
        a, b = pairs // self.n_cells, pairs % self.n_cells
        cnt = np.bincount(a, minlength=self.n_cells)
        S = int(cnt.max())
        start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        posn = np.arange(a.size) - start[a]
        nbrs = np.full((self.n_cells, S), -1, dtype=np.int64)
        nbrs[a, posn] = b
        self.stencil = np.where(nbrs >= 0, nbrs, np.arange(self.n_cells)[:, None]).astype(np.int64)
        self.stencil_coef_local, self.tangent_basis = least_squares_stencil(self.xbar, nbrs)
        self.stencil_neighbours = nbrs

    # ------------------------------------------------------------------ points
    def cell_of(self, points) -> np.ndarray:
        """Index of the cell containing each unit point (n, d)."""
        ang = to_angles(as_points(points, self.dim))
        idx = []
        for k, c in enumerate(self.counts):
            width = (2 * np.pi if k == len(self.counts) - 1 else np.pi) / c
            idx.append(np.clip(np.floor(ang[:, k] / width).astype(np.int64), 0, c - 1))
        return self._lattice_cell[np.ravel_multi_index(tuple(idx), self.counts)]

    def sample_in_cells(self, cells, rng=None) -> np.ndarray:
        """One uniform point (surface measure) in each listed cell: inverse CDF in each angle, exact
        because the volume element is a product of one-angle factors sin^m(psi_j)."""
        rng = np.random.default_rng(rng)
        cells = np.asarray(cells, dtype=np.int64)
        if cells.size and (cells.min() < 0 or cells.max() >= self.n_cells):
            raise ValueError(f"cells must be in [0, {self.n_cells}), got range [{cells.min()}, {cells.max()}]")
        lo, hi = self.lo[cells], self.hi[cells]
        m = self.dim - 1
        ang = np.empty((cells.size, m))
        exps = _sin_exponents(self.dim) + [0]
        for j in range(m):
            u = rng.random(cells.size)
            a, b, e = lo[:, j], hi[:, j], exps[j]
            if e == 0:
                ang[:, j] = a + u * (b - a)
            elif e == 1:
                ang[:, j] = np.arccos(np.cos(a) - u * (np.cos(a) - np.cos(b)))
            else:  # bisection on the closed-form CDF (monotone), to round-off
                target = u * sin_power_integral(e, a, b)
                left, right = a.copy(), b.copy()
                for _ in range(60):
                    mid = 0.5 * (left + right)
                    below = sin_power_integral(e, a, mid) < target
                    left = np.where(below, mid, left)
                    right = np.where(below, right, mid)
                ang[:, j] = 0.5 * (left + right)
        return embed(ang)

    # ------------------------------------------------------------------ plotting
    def plot(self, f, ax=None, chi: float = np.pi / 2, **kwargs):
        """Plot cell values ``f`` (N,): d = 2 a step line over phi; d = 3 a (phi, theta) map;
        d = 4 the (phi, theta) map of the cells cut by the slice chi = ``chi``. Returns the axes."""
        import matplotlib.pyplot as plt
        from matplotlib.collections import PolyCollection

        f = np.asarray(f, float)
        if f.shape != (self.n_cells,):
            raise ValueError(f"f must have shape ({self.n_cells},), got {f.shape}")
        if ax is None:
            _, ax = plt.subplots()
        if self.dim == 2:
            order = np.argsort(self.lo[:, 0])
            x = np.append(self.lo[order, 0], 2 * np.pi)
            ax.stairs(f[order], x, **kwargs)
            ax.set_xlabel("phi")
            ax.set_ylabel("f")
            return ax
        if self.dim == 3:
            sel = np.arange(self.n_cells)
            t_ax, title = 0, None
        elif self.dim == 4:
            sel = np.flatnonzero((self.lo[:, 0] <= chi) & (chi < self.hi[:, 0]))
            t_ax, title = 1, f"slice chi = {chi:.3g}"
        else:
            raise NotImplementedError("plot supports d = 2, 3, 4")
        p0, p1 = self.lo[sel, -1], self.hi[sel, -1]
        t0, t1 = self.lo[sel, t_ax], self.hi[sel, t_ax]
        verts = np.stack([np.stack([p0, t0], 1), np.stack([p1, t0], 1), np.stack([p1, t1], 1),
                          np.stack([p0, t1], 1)], axis=1)
        coll = PolyCollection(verts, array=f[sel], **kwargs)
        ax.add_collection(coll)
        ax.set_xlim(0, 2 * np.pi)
        ax.set_ylim(np.pi, 0)
        ax.set_xlabel("phi")
        ax.set_ylabel("theta")
        if title:
            ax.set_title(title)
        plt.colorbar(coll, ax=ax)
        return ax
