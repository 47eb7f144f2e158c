"""What every grid provides: cells, faces, quadrature, reconstruction stencils.

A grid's job is geometry only. The finite-volume kernels see flat arrays, never grid objects:

- cells: ``centers`` (N, d) unit vectors, ``areas`` (N,), ``xbar`` (N, d) the cell mean positions
  (1/|C| int_C x dA, inside the ball), a quadrature ``cell_points`` / ``cell_weights``;
- faces: ``owner``, ``neighbour`` (F,), Gauss points ``face_points`` (F, G, d) and weighted normals
  ``face_normals`` (F, G, d) such that sum_g u(X_g) . W_g approximates the flux integral
  int_face u . n ds out of the owner; ``face_length`` (F,) and ``face_unit_normal`` (F, d) at the
  midpoint for reference;
- cell-to-face incidence ``cell_faces`` (N, K) and ``cell_face_sign`` (N, K) (+1 owner, -1 neighbour,
  0 padding with face index 0);
- a least-squares gradient stencil ``stencil`` (N, S), tangent frames ``tangent_basis`` (N, d-1, d) and
  the coefficients in those frames ``stencil_coef_local`` (N, S, d-1):
  grad f_i = sum_k,t coef[i, k, t] (f[stencil[i, k]] - f[i]) basis[i, t] (padding: index i, coefficient
  0); ``stencil_coef`` (N, S, d) is the same in ambient coordinates;
- for the third-order scheme (``Options(scheme="quadratic")``), derived from the above on first use:
  the cells' central second moments ``cell_moments2`` (N, d, d) and the quadratic least-squares
  coefficients ``quadratic_coef`` (:func:`quadratic_stencil`).
"""
from __future__ import annotations

from functools import cached_property

import numpy as np
from numba import njit

__all__ = ["Grid", "least_squares_stencil", "quadratic_stencil", "quadratic_width", "tangent_frames",
           "stencil_classes", "incidence"]


#: A cell whose quadrature values spread by more than this fraction of their largest magnitude is checked
#: against its sub-cells in adaptive cell averages (below it the base rule is accurate: tests/test_healpix.py).
ADAPTIVE_SPREAD = 0.1
#: A feature (point, width) forces refinement of pieces wider than ``width`` within this many widths of the
#: point: a vMF density exp(kappa (<mu, x> - 1)) with width 1 / sqrt(kappa) is exp(-50) ~ 2e-22 of its
#: peak there.
FEATURE_REACH = 10.0
#: Gauss order of the refined pieces (2 order^2 points on a HEALPix piece): a Gaussian of width w on pieces of
#: size w / 4 is then integrated to ~1e-14, with ~40^2 pieces on a feature (order 4 needs ~200^2).
REFINE_ORDER = 8


def _features(features, d: int) -> list:
    out = []
    for item in features or ():
        p, width = item
        p = np.asarray(p, float).reshape(-1)
        width = float(width)
        if p.shape != (d,) or not np.all(np.isfinite(p)) or not np.linalg.norm(p) > 0:
            raise ValueError(f"a feature point must be a finite nonzero vector of length {d}, got {item[0]!r}")
        if not (np.isfinite(width) and width > 0):
            raise ValueError(f"a feature width must be finite and > 0, got {item[1]!r}")
        out.append((p / np.linalg.norm(p), width))
    return out



class Grid:
    """Base class. Subclasses fill the arrays listed in the module docstring."""

    dim: int
    centers: np.ndarray
    areas: np.ndarray
    xbar: np.ndarray
    owner: np.ndarray
    neighbour: np.ndarray
    face_points: np.ndarray
    face_normals: np.ndarray
    face_weights: np.ndarray
    cell_faces: np.ndarray
    cell_face_sign: np.ndarray
    stencil: np.ndarray
    stencil_coef_local: np.ndarray
    tangent_basis: np.ndarray

    #: Steps between the solver's calls of :meth:`regrid`; 0: the grid never changes during a run.
    regrid_interval: int = 0
    #: The angle phi_0 of the first cell when the grid is the circle S^1 cut into equal cells numbered in
    #: order (cell j centred at phi_0 + 2 pi j / N): sums over it are circular convolutions (the FFT path
    #: of the attention field); None for every other grid.
    circle_start: float | None = None

    def initial(self, f0, attention_scale: float = 0.0, kernels=()) -> "Grid":
        """The grid a run from the initial density ``f0(x)`` starts on: ``self`` for a fixed grid; an adaptive
        grid refines where ``f0`` needs it (:meth:`spherepde.grids.adaptive.AdaptiveHealpixGrid.initial`)."""
        return self

    def regrid(self, f, attention_scale: float = 0.0, quadratic: bool = False, kernels=()):
        """``(new grid, f on it)`` when the grid adapts to the density ``f``, else None (a fixed grid: always).
        The solver calls it every :attr:`regrid_interval` steps and remakes its grid arrays in one place;
        ``quadratic``: move f with the quadratic reconstruction (the scheme's), not the linear one;
        ``attention_scale`` and ``kernels``: the model's (:func:`spherepde.models.terms.attention_scale`,
        :func:`~spherepde.models.terms.attention_kernels`), for criteria that follow the attention."""
        return None

    def move_field(self, values, target: "Grid") -> np.ndarray:
        """Cell-centre values (N, ...) of a smooth field (the attention mean) on ``target``, a grid that
        :meth:`regrid` made from this one: ``values`` itself when the cells are the same (a fixed grid)."""
        if target is self:
            return values
        raise ValueError(f"{type(self).__name__} does not regrid: target must be the grid itself")

    def kept_cells(self, old: "Grid"):
        """Boolean (N,): the cells of this grid that are cells of ``old``, the grid :meth:`regrid` made it
        from, so that :meth:`move_field` hands them their old values unchanged; None when unknown (every
        cell then counts as new). A fixed grid keeps all its cells."""
        return np.ones(self.n_cells, bool) if old is self else None

    def kept_faces(self, old: "Grid"):
        """``(rows, src)``: the faces of this grid that ``old`` (the grid :meth:`regrid` made it from) has too,
        with the same quadrature points and normals bit for bit, as their indices here (``rows``) and in ``old``
        (``src``), so that a steady local field's face weights there can be carried over instead of evaluated
        again; None when unknown (every face counts as new). A fixed grid keeps all its faces."""
        if old is self:
            every = np.arange(self.n_faces)
            return every, every
        return None

    def kept_stencils(self, old: "Grid"):
        """Boolean (N,): the cells of this grid whose least-squares gradient is the same computation as in
        ``old`` (the grid :meth:`regrid` made it from): the cell itself, its stencil cells (leaves of ``old``
        too), its mean position and its stencil coefficients, bit for bit. A field that keeps its cell values
        on those cells has the same gradient bits there, and a face of :meth:`kept_faces` between two such
        cells the same interpolated values at its Gauss points. None when unknown. A fixed grid keeps all."""
        if old is self:
            return np.ones(self.n_cells, bool)
        return None

    def cells_state(self) -> dict:
        """What a checkpoint needs to rebuild this grid's cells ({} for a fixed grid; see :meth:`with_cells`)."""
        return {}

    def with_cells(self, state: dict) -> "Grid":
        """The grid with the cells of a :meth:`cells_state` (``self`` for a fixed grid)."""
        return self

    @property
    def n_cells(self) -> int:
        return self.centers.shape[0]

    @property
    def n_faces(self) -> int:
        return self.owner.shape[0]

    @property
    def total_area(self) -> float:
        return float(self.areas.sum())

    @cached_property
    def stencil_coef(self) -> np.ndarray:
        """(N, S, d) least-squares coefficient vectors in the ambient space:
        grad f_i = sum_k coef[i, k] (f[stencil[i, k]] - f[i])."""
        return ambient_coef(self.stencil_coef_local, self.tangent_basis)

    @cached_property
    def stencil_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """(cls (N,) int32, table (C, S, d-1)): the frame coefficients ``stencil_coef_local`` with cells of
        equal coefficients (cells a symmetry of the grid maps onto each other) sharing one table row;
        ``table[cls[i]]`` equals ``stencil_coef_local[i]`` to 1e-12 relative. HEALPix nside 256: 67332
        rows for 786432 cells, so the stage kernel streams a class index instead of 128 bytes."""
        return stencil_classes(self.stencil_coef_local)

    @cached_property
    def cell_moments2(self) -> np.ndarray:
        """(N, d, d) central second moments (1/|C_i|) int_{C_i} (x - xbar_i)(x - xbar_i)^T dA of the cells,
        from the cell quadrature ``cell_points`` / ``cell_weights`` (grids with another rule override it)."""
        off = self.cell_points - self.xbar[:, None, :]
        return np.ascontiguousarray(np.einsum("nqa,nqb,q->nab", off, off, self.cell_weights))

    @cached_property
    def quadratic_coef(self) -> tuple[np.ndarray, np.ndarray]:
        """(coef (N, S, R), qmean (N, R - (d - 1))): the quadratic least-squares reconstruction of
        :func:`quadratic_stencil` on this grid's stencil, frames, mean positions and second moments."""
        nbrs = np.where(self.stencil == np.arange(self.n_cells)[:, None], -1, self.stencil)
        return quadratic_stencil(self.xbar, self.cell_moments2, nbrs, self.tangent_basis)

    @cached_property
    def quadratic_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """(cls (N,), table (C, S, R)): :attr:`quadratic_coef` grouped as in :attr:`stencil_classes`."""
        return stencil_classes(self.quadratic_coef[0])

    @cached_property
    def log_quadratic_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """(cls (N,), table (C, S, R)): the coefficients of the log-quadratic scheme
        (``Options(scheme="log-quadratic")``, :func:`spherepde.kernels.fv.stage_update_log`), grouped as in
        :attr:`stencil_classes`: the weighted least-squares quadratic through the *point values* of log f
        at the neighbours' mean positions (:func:`quadratic_stencil` with zero second moments, frames
        ``tangent_basis`` about ``xbar``): log f is fitted as a function, not as cell means, since the
        log of a cell mean is not the mean of the log."""
        nbrs = np.where(self.stencil == np.arange(self.n_cells)[:, None], -1, self.stencil)
        zero = np.zeros((self.n_cells, self.dim, self.dim))
        return stencil_classes(quadratic_stencil(self.xbar, zero, nbrs, self.tangent_basis)[0])

    @cached_property
    def source_rule(self) -> tuple[np.ndarray, np.ndarray]:
        """(points (N, P, d), offsets (N, P, d)): a P = 2 (d - 1) point rule per cell on the sphere for the
        attention field's sources with the quadratic scheme. The points lie at geodesic distance s_k along
        +-e_k from the direction of xbar, e_k the principal axes of the cell's tangential second moment
        (eigenvalues l_k) and s_k = sqrt((d - 1) l_k), so that equal weights reproduce the cell's mass,
        first moment (the mean of the points is xbar to O(h^4)) and second moments; ``offsets`` are
        s_k e_k with their signs, for the weights |C| / P (f + theta g . offset) that add the linear
        variation of f (:func:`source_weights`). A smooth kernel integrated with this rule errs by
        O(h^3) per unit area (third moments), against O(h^2) for a point mass at the centre."""
        d = self.dim
        B = self.tangent_basis
        Mt = np.einsum("nsa,nab,ntb->nst", B, self.cell_moments2, B)  # (N, d-1, d-1)
        lam, vec = np.linalg.eigh(Mt)
        lam = np.maximum(lam, 0.0)
        axes = np.einsum("nsk,nsd->nkd", vec, B)  # (N, d-1, d) unit tangent axes
        step = np.sqrt((d - 1) * lam)  # (N, d-1)
        n = self.xbar / np.linalg.norm(self.xbar, axis=1, keepdims=True)
        pts, off = [], []
        for k in range(d - 1):
            for sgn in (1.0, -1.0):
                sk = step[:, k, None]
                pts.append(np.cos(sk) * n + sgn * np.sin(sk) * axes[:, k])
                off.append(sgn * sk * axes[:, k])
        pts = np.stack(pts, axis=1)
        pts /= np.linalg.norm(pts, axis=2, keepdims=True)
        return np.ascontiguousarray(pts), np.ascontiguousarray(np.stack(off, axis=1))

    @cached_property
    def center_quadratic_coef(self) -> np.ndarray:
        """(N, S, R) coefficients of the quadratic least-squares fit of *point values* at the cell centres
        (no cell means: :func:`quadratic_stencil` with zero second moments), in the frames
        ``tangent_basis`` about ``centers``: how the quadratic scheme interpolates the attention mean,
        evaluated at the centres, to the face Gauss points (third order)."""
        nbrs = np.where(self.stencil == np.arange(self.n_cells)[:, None], -1, self.stencil)
        zero = np.zeros((self.n_cells, self.dim, self.dim))
        return quadratic_stencil(self.centers, zero, nbrs, self.tangent_basis)[0]

    @cached_property
    def cell_inflow(self) -> np.ndarray:
        """(N, K) int32: for slot k of cell i, the flat slot ``j * K + k'`` of the same face in the
        list of the cell j across it (padding: the slot ``i * K + k`` itself).

        The stage kernel stores each cell's outflow through each of its faces at slot i * K + k; the
        inflow through that face is the outflow stored at this index, so every face's flux is computed
        once and enters the two cells with opposite signs (exact conservation)."""
        out, ok = _inflow_slots(self.cell_faces, self.cell_face_sign, self.owner, self.neighbour)
        if not ok:  # pragma: no cover - a broken incidence table
            raise RuntimeError("cell_faces is not symmetric: a face is missing from a neighbour's list")
        return out

    def _cell_inflow_numpy(self) -> np.ndarray:
        """:attr:`cell_inflow` in NumPy (the twin of the Numba loop, for the tests; 3-4x its time)."""
        faces, sign = self.cell_faces, self.cell_face_sign
        N, K = faces.shape
        cells = np.arange(N)[:, None]
        other = np.where(self.owner[faces] == cells, self.neighbour[faces], self.owner[faces])
        match = (faces[other] == faces[:, :, None]) & (sign[other] == -sign[:, :, None])
        slot = np.argmax(match, axis=2)
        real = sign != 0
        if not np.all(match.any(axis=2)[real]):  # pragma: no cover - a broken incidence table
            raise RuntimeError("cell_faces is not symmetric: a face is missing from a neighbour's list")
        own = cells * K + np.arange(K)[None, :]
        return np.where(real, other * K + slot, own).astype(np.int32)

    @cached_property
    def stencil_offsets(self) -> np.ndarray:
        """(N, S) ``stencil[i] - i``, int16 where that fits (else int32): what the stage kernel reads (on
        ordered grids the neighbours are near in index; HEALPix RING: |offset| <= ~8 nside)."""
        return _small_ints(self.stencil.astype(np.int64) - np.arange(self.n_cells)[:, None])

    @cached_property
    def inflow_offsets(self) -> np.ndarray:
        """(N, K) ``cell_inflow[i] - i * K``, int16 where that fits (else int32)."""
        K = self.cell_faces.shape[1]
        return _small_ints(self.cell_inflow.astype(np.int64) - K * np.arange(self.n_cells)[:, None])

    #: (small, large) cell lists of the stage kernel on grids with mixed stencil sizes (see
    #: :func:`spherepde.kernels.fv.stage_update_compact`); None: one loop over all cells.
    kernel_split = None

    @cached_property
    def kernel_areas(self) -> np.ndarray:
        """``areas``, or a (1,) array when all cells have the same area (HEALPix): the kernels then read
        one number instead of streaming N."""
        if self.n_cells and np.all(self.areas == self.areas[0]):
            return self.areas[:1].copy()
        return self.areas

    @cached_property
    def face_slots(self) -> np.ndarray:
        """(F, 2) int32: the slot k of each face in its owner's and in its neighbour's row of
        ``cell_faces`` (so that face-major kernels can write cell-major arrays directly)."""
        faces, sign = self.cell_faces, self.cell_face_sign
        N, K = faces.shape
        out = np.full((self.n_faces, 2), -1, dtype=np.int32)
        cells, slots = np.nonzero(sign > 0)
        out[faces[cells, slots], 0] = slots
        cells, slots = np.nonzero(sign < 0)
        out[faces[cells, slots], 1] = slots
        if np.any(out < 0):  # pragma: no cover - a broken incidence table
            raise RuntimeError("cell_faces does not list every face for both of its cells")
        return out

    @cached_property
    def error_blocks(self) -> np.ndarray:
        """(N,) block index of every cell: a partition of the grid into blocks of about 2 x 2 cells (2 on
        S^1), in which the solver's time-error norm sums the error's mass (:mod:`spherepde.steppers`).

        Why: where the positivity limiter acts (a nearly empty cell next to a dense one) the update is not
        a smooth function of the state, so the embedded estimate of such a cell need not shrink with dt;
        the mass it misplaces sits in its neighbours with the opposite sign. Summed over 2 x 2 blocks
        these exchanges cancel. Measured on the paper's run at beta 100, nside 32, after the collapse,
        with the limiter's outflow cap |C| f / dt alone (before the step-independent bound of
        :mod:`spherepde.kernels.fv`): the cell-level error ratio stayed at 1.0-1.4e-2 for every dt from
        1e-6 to the CFL step, the block-level one fell in proportion to dt, 7.6e-7 to 5.4e-3. The time
        error is so measured at twice the cell size, the resolution of the scheme. This default bins the cell centres (d = 3:
        a HEALPix map with pixels twice the cell width; d = 2: angle bins of two cells; d >= 4: the cells
        themselves); grids override it with their own lattice."""
        c = np.asarray(self.centers, float)
        N = c.shape[0]
        if self.dim == 2:
            nb = max(1, N // 2)
            phi = np.mod(np.arctan2(c[:, 1], c[:, 0]), 2 * np.pi)
            return np.minimum((phi / (2 * np.pi / nb)).astype(np.int64), nb - 1)
        if self.dim == 3:
            import healpy as hp

            nside = max(1, int(round(np.sqrt(N / 12.0) / 2)))
            return hp.vec2pix(nside, c[:, 0], c[:, 1], c[:, 2]).astype(np.int64)
        return np.arange(N, dtype=np.int64)

    def mass(self, f) -> float:
        """Total mass sum_i f_i |C_i| of a cell-average density ``f`` (pairwise summation: the rounding
        error grows like log N, so mass drift below 1e-14 stays visible on large grids)."""
        f = np.asarray(f, float)
        if self.kernel_areas.shape[0] == 1 and f.shape == self.areas.shape:  # equal areas: no temporary
            return float(self.kernel_areas[0] * np.sum(f))
        return float(np.sum(f * self.areas))

    def cell_average(self, func, order: int | None = None) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    # Sub-cells for adaptive cell averages. A subclass that supports ``cell_average(..., rtol=...)``
    # describes a piece of a cell by one row of floats and provides: ``_sub_roots()`` -> (desc, owner),
    # the level-0 pieces and their cells; ``_sub_rule(desc, order, root)`` -> points (n, Q, d) and area
    # weights (n, Q); ``_sub_children(desc)`` -> (child desc, parent index), exact sub-pieces that tile
    # the parent; ``_sub_ball(desc)`` -> (centre (n, d), radius (n,)), a chordal ball containing the piece.
    def _adaptive_average(self, func, order: int, rtol: float, features=None, max_level: int = 40,
                          max_pieces: int = 4_000_000, spread: float = ADAPTIVE_SPREAD,
                          chunk: int = 32768, refine_order: int = REFINE_ORDER) -> tuple[np.ndarray, dict]:
        """Cell averages by adaptive quadrature, and a dict of what it did.

        Every cell is first integrated by the base rule (``order``). Cells whose values at the nodes
        spread by more than ``spread`` of their largest magnitude, or that lie near a ``feature``, are
        split into exact sub-cells, recursively: a piece is accepted (its children's sum kept) once
        |base rule - sum over its children| <= rtol max(|its integral|, |total| x its area share), and
        never while it is wider than a feature (point, width) within ``FEATURE_REACH`` widths of it (the
        nodes could miss the feature, the estimate with them). The dict: ``tested`` cells, ``pieces``
        evaluated, ``levels``, ``error`` (the relative error estimate of the total), ``converged``
        (False: ``max_level`` or ``max_pieces`` reached, the unrefined pieces kept), ``noise_limited``
        (halving stopped reducing the estimate, a sign that round-off in ``func`` exceeds ``rtol``: the
        pieces are kept as they are).
        """
        d = self.dim
        feats = _features(features, d)

        refine_order = max(order, refine_order)

        def integrate(desc, root=False):
            n = desc.shape[0]
            I, A, flag = np.empty(n), np.empty(n), np.zeros(n, bool)
            for s in range(0, n, chunk):
                pts, w = self._sub_rule(desc[s:s + chunk], order if root else refine_order, root)
                v = np.asarray(func(pts.reshape(-1, d)), float).reshape(w.shape)
                if not np.all(np.isfinite(v)):
                    raise ValueError("func returned NaN or inf at some quadrature points")
                I[s:s + chunk] = np.einsum("nq,nq->n", v, w)
                A[s:s + chunk] = w.sum(axis=1)
                flag[s:s + chunk] = (v.max(axis=1) - v.min(axis=1)) > spread * np.abs(v).max(axis=1)
            return I, A, flag

        def forced(desc):
            # pieces wider than a feature, or near one: the rule's nodes may miss it entirely, so the
            # error estimate (parent against children) cannot be trusted there
            out = np.zeros(desc.shape[0], bool)
            if not feats or not desc.shape[0]:
                return out
            c, r = self._sub_ball(desc)
            for p, width in feats:
                out |= (r > width) & (np.linalg.norm(c - p, axis=1) < r + FEATURE_REACH * width)
            return out

        desc, owner = self._sub_roots()
        I, A, flag = integrate(desc, root=True)
        flag |= forced(desc)
        N = self.n_cells
        keep = ~flag
        num = np.zeros(N)
        den = np.zeros(N)

        def accept(sel, own, vals, areas):
            num[:] += np.bincount(own[sel], vals[sel], minlength=N)
            den[:] += np.bincount(own[sel], areas[sel], minlength=N)
            return float(np.abs(vals[sel]).sum())

        acc_abs = accept(keep, owner, I, A)
        area = float(np.sum(A))
        desc, owner, I, A = desc[flag], owner[flag], I[flag], A[flag]
        info = {"tested": int(flag.sum()), "pieces": 0, "levels": 0, "error": 0.0, "converged": True,
                "noise_limited": False}
        err_acc = 0.0  # estimated error of what is accepted
        prev_err = np.inf
        while desc.shape[0]:
            cd, par = self._sub_children(desc)
            if info["levels"] >= max_level or info["pieces"] + cd.shape[0] > max_pieces:
                info["converged"] = False  # keep what we have, with its error estimate
                break
            cI, cA, _ = integrate(cd)
            info["pieces"] += cd.shape[0]
            info["levels"] += 1
            Ic = np.bincount(par, cI, minlength=desc.shape[0])
            err = np.abs(I - Ic)  # the parent's error; its children's sum is what is kept
            tau = rtol * (acc_abs + float(np.abs(Ic).sum()))
            free = ~forced(desc)
            # a global budget tau on the total error: half of it shared by area or by content (most pieces
            # pass here), the other half for the rest once their summed error fits (pieces next to a
            # singular point of the map, a pole, keep a fixed relative error per level, so only their
            # shrinking content makes them converge)
            share = np.maximum(A / area, np.abs(Ic) / max(acc_abs + float(np.abs(Ic).sum()), np.finfo(float).tiny))
            ok = free & (err <= 0.5 * tau * share)
            rest = free & ~ok
            rest_err = float(err[rest].sum())
            if err_acc + err[ok].sum() + rest_err <= tau:
                ok |= rest
            elif rest_err > 0.5 * prev_err:
                # no progress from halving: func's own noise (round-off in it) is above the target
                ok |= rest
                info["noise_limited"] = True
            prev_err = rest_err
            okc = ok[par]
            acc_abs += accept(okc, owner[par], cI, cA)
            err_acc += float(err[ok].sum())
            nxt = ~okc
            desc, owner, I, A = cd[nxt], owner[par[nxt]], cI[nxt], cA[nxt]
        if desc.shape[0]:
            acc_abs += accept(np.ones(desc.shape[0], bool), owner, I, A)
            err_acc += float(np.abs(I).sum())  # unrefined pieces: no estimate better than their content
        info["error"] = err_acc / max(acc_abs, np.finfo(float).tiny)
        return num / den, info

    def sample_in_cells(self, cells, rng=None) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def face_flux_of(self, u) -> np.ndarray:
        """Approximate int_face u . n ds out of the owner for a field ``u(x) -> (n, d)``; shape (F,)."""
        F, G, d = self.face_points.shape
        vals = np.asarray(u(self.face_points.reshape(-1, d)), float).reshape(F, G, d)
        return np.einsum("fgk,fgk->f", vals, self.face_normals)

    def discrete_divergence(self, u) -> np.ndarray:
        """(1/|C_i|) sum over faces of the flux of ``u``: the cell-average divergence, shape (N,)."""
        flux = self.face_flux_of(u)
        net = np.sum(self.cell_face_sign * flux[self.cell_faces], axis=1)
        return net / self.areas


def _small_ints(a: np.ndarray) -> np.ndarray:
    """``a`` as int16 if every value fits, else int32."""
    if a.size == 0 or (a.min() >= np.iinfo(np.int16).min and a.max() <= np.iinfo(np.int16).max):
        return np.ascontiguousarray(a.astype(np.int16))
    return np.ascontiguousarray(a.astype(np.int32))


def incidence(owner: np.ndarray, neighbour: np.ndarray, n_cells: int, width: int):
    """Cell-to-face incidence arrays from the face lists (padding: face 0 with sign 0): each cell's faces it
    owns in face order, then those it neighbours in face order. One pass over the faces (an adaptive grid
    makes it at every regrid: 41 ms at 181k cells by sorts and np.add.at, :func:`_incidence_numpy`, its twin)."""
    faces, sign, count, ok = _incidence_loop(np.asarray(owner, np.int64), np.asarray(neighbour, np.int64),
                                             int(n_cells), int(width))
    if not ok:
        raise ValueError(f"a cell has more than {width} faces")
    return faces, sign, count


@njit(cache=True)
def _incidence_loop(owner, neighbour, n_cells, width):
    faces = np.zeros((n_cells, width), np.int32)  # int32/int8: less memory traffic in kernels
    sign = np.zeros((n_cells, width), np.int8)
    count = np.zeros(n_cells, np.int64)
    for side in range(2):
        cells, s = (owner, 1) if side == 0 else (neighbour, -1)
        for f in range(len(cells)):
            c = cells[f]
            k = count[c]
            if k >= width:
                return faces, sign, count, False
            faces[c, k] = f
            sign[c, k] = s
            count[c] = k + 1
    return faces, sign, count, True


def _incidence_numpy(owner: np.ndarray, neighbour: np.ndarray, n_cells: int, width: int):
    """:func:`incidence` by sorts (its NumPy twin, for the tests)."""
    faces = np.zeros((n_cells, width), dtype=np.int32)
    sign = np.zeros((n_cells, width), dtype=np.int8)
    count = np.zeros(n_cells, dtype=np.int64)
    for cells, s in ((owner, 1.0), (neighbour, -1.0)):
        order = np.argsort(cells, kind="stable")
        sorted_cells = cells[order]
        # position of each face within its cell's list, offset by what the cell already has
        first = np.searchsorted(sorted_cells, sorted_cells, side="left")
        pos = np.arange(len(order)) - first + count[sorted_cells]
        if pos.size and pos.max() >= width:
            raise ValueError(f"a cell has more than {width} faces")
        faces[sorted_cells, pos] = order
        sign[sorted_cells, pos] = s
        np.add.at(count, cells, 1)
    return faces, sign, count


def ambient_coef(local: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """(n, S, d) = sum_t local[n, s, t] basis[n, t, :] (:attr:`Grid.stencil_coef` of the rows given), as
    broadcast products summed in t order: the bits of np.einsum("nst,ntd->nsd") (checked on S^1-S^3 shapes)
    at a third of its time (0.13 -> 0.04 s at 150k cells). Row by row, so a subset of rows has the bits of
    the whole array's."""
    out = local[:, :, 0, None] * basis[:, None, 0, :]
    for t in range(1, local.shape[2]):
        out += local[:, :, t, None] * basis[:, None, t, :]
    return out


def least_squares_stencil(xbar: np.ndarray, neighbours: np.ndarray, basis: np.ndarray | None = None,
                          rows: np.ndarray | None = None):
    """Coefficients of the least-squares gradient in the tangent plane at each cell, in a tangent frame.

    Parameters
    ----------
    xbar : (N, d) cell mean positions.
    neighbours : (N, S) neighbour indices, -1 where absent.
    basis : (N, d-1, d), optional
        Orthonormal tangent frames at xbar / |xbar|; default :func:`tangent_frames`.
    rows : (n,) int array, optional
        Only these cells (``neighbours`` and ``basis`` then hold their n rows; ``xbar`` stays all N): what
        a grid that changes in a few cells recomputes (:class:`~spherepde.grids.adaptive.AdaptiveHealpixGrid`).

    Returns
    -------
    coef : (N, S, d-1)
        grad f_i = sum_k coef[i, k, t] (f_nb - f_i) basis[i, t] (summed over t); zero rows for absent
        neighbours.
    basis : (N, d-1, d)
        The frames used.

    Notes
    -----
    Minimises sum_k w_k (f_k - f_i - g . (xbar_k - xbar_i))^2 over g in the tangent space at
    xbar_i / |xbar_i| (dimension d - 1), with weights w_k = 1 / |xbar_k - xbar_i|^2. The gradient is
    the same vector in any frame; the frame only decides which d - 1 numbers the kernels store (the
    stage kernel works in the frame: d - 1 coefficients per neighbour instead of d).
    """
    N, S = neighbours.shape
    present = neighbours >= 0
    centre = xbar if rows is None else xbar[rows]
    nb = np.where(present, neighbours, (np.arange(N) if rows is None else rows)[:, None])
    diff = xbar[nb] - centre[:, None, :]  # (N, S, d)
    if basis is None:
        basis = tangent_frames(centre)
    local = np.einsum("nsd,ntd->nst", diff, basis)  # (N, S, d-1)
    dist2 = np.einsum("nsd,nsd->ns", diff, diff)
    w = np.where(present, 1.0 / np.where(dist2 > 0, dist2, 1.0), 0.0)
    normal = np.einsum("ns,nst,nsu->ntu", w, local, local)  # (N, d-1, d-1)
    inv = np.linalg.inv(normal)
    coef = np.einsum("ntu,ns,nsu->nst", inv, w, local)  # (N, S, d-1)
    return np.ascontiguousarray(coef), np.ascontiguousarray(basis)


def quadratic_width(d: int) -> tuple[int, int]:
    """(L, Q): the linear (d - 1) and quadratic ((d - 1) d / 2) coefficients of a quadratic in the
    tangent frame of S^{d-1}."""
    return d - 1, (d - 1) * d // 2


def quadratic_pairs(d: int) -> list[tuple[int, int]]:
    """The frame index pairs (s, t), s <= t, of the quadratic monomials u_s u_t, in storage order."""
    return [(s, t) for s in range(d - 1) for t in range(s, d - 1)]


def quadratic_pair_arrays(d: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quadratic_pairs` as two contiguous int64 arrays (s's, t's), what the kernels take."""
    pairs = np.array(quadratic_pairs(d), dtype=np.int64).reshape(-1, 2)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


def quadratic_stencil(xbar: np.ndarray, moments2: np.ndarray, neighbours: np.ndarray, basis: np.ndarray):
    """Coefficients of the quadratic least-squares reconstruction (third order) at each cell.

    In cell i's tangent frame (``basis[i]``, rows b_t), with u = B_i (x - xbar_i), the reconstruction is

        p_i(x) = f_i + sum_t g_t u_t + sum_{s<=t} h_st (u_s u_t - m_st),   m_st = mean over C_i of u_s u_t,

    whose mean over C_i is f_i (conservative). The coefficients r = (g, h) minimise
    sum_k w_k (mean_{C_k} p_i - f_k)^2 over the stencil neighbours k, w_k = 1 / |xbar_k - xbar_i|^2, where
    the cell means of the monomials are exact: mean_{C_k} u = B_i (xbar_k - xbar_i) and
    mean_{C_k} u u^T = B_i (M_k + D D^T) B_i^T, D = xbar_k - xbar_i, M_k the central second moments of C_k
    (``moments2``). The fit is exact for every quadratic in u (k-exact, k = 2), so the reconstructed face
    values are third-order accurate for smooth f on any cell shapes and sizes (mixed orders of an
    adaptive grid included) where the stencil has at least L + Q well-placed neighbours
    (:func:`quadratic_width`: 5 on S^2; HEALPix has 7-8, the tensor and adaptive stencils more).

    Parameters
    ----------
    xbar : (N, d) cell mean positions. moments2 : (N, d, d) central second moments.
    neighbours : (N, S) neighbour indices, -1 where absent. basis : (N, d-1, d) tangent frames.

    Returns
    -------
    coef : (N, S, L + Q)
        r_i = sum_k coef[i, k] (f[neighbour k] - f_i); zero rows for absent neighbours.
    qmean : (N, Q)
        m_st of each cell (the means subtracted from the quadratic monomials).
    """
    N, S = neighbours.shape
    d = xbar.shape[1]
    L, Q = quadratic_width(d)
    pairs = quadratic_pairs(d)
    present = neighbours >= 0
    nb = np.where(present, neighbours, np.arange(N)[:, None])
    D = xbar[nb] - xbar[:, None, :]  # (N, S, d)
    lin = np.einsum("nsd,ntd->nst", D, basis)  # mean_{C_k} u, (N, S, L)
    Mi = np.einsum("nsa,nab,ntb->nst", basis, moments2, basis)  # (N, L, L): m_st of cell i
    Mk = np.einsum("nsa,nkab,ntb->nkst", basis, moments2[nb], basis) + lin[:, :, :, None] * lin[:, :, None, :]
    A = np.empty((N, S, L + Q))
    A[:, :, :L] = lin
    qmean = np.empty((N, Q))
    for j, (a, b) in enumerate(pairs):
        A[:, :, L + j] = Mk[:, :, a, b] - Mi[:, None, a, b]
        qmean[:, j] = Mi[:, a, b]
    dist2 = np.einsum("nsd,nsd->ns", D, D)
    w = np.where(present, 1.0 / np.where(dist2 > 0, dist2, 1.0), 0.0)
    # scale the columns (linear ~ h, quadratic ~ h^2) so the normal matrix is well conditioned
    h = np.sqrt(np.where(present, dist2, 0.0).max(axis=1))
    h = np.where(h > 0, h, 1.0)
    scale = np.concatenate([np.repeat(h[:, None], L, axis=1), np.repeat((h * h)[:, None], Q, axis=1)], axis=1)
    As = A / scale[:, None, :]
    normal = np.einsum("ns,nsa,nsb->nab", w, As, As)
    ev = np.linalg.eigvalsh(normal) if N else np.ones((0, L + Q))
    singular = ev[:, 0] <= 1e-10 * ev[:, -1]
    if np.any(singular):
        bad = int(np.nonzero(singular)[0][0])
        raise ValueError(f"the quadratic reconstruction needs at least {L + Q} neighbours in general position; cell "
                         f"{bad} has {int(present[bad].sum())} (use scheme='linear' on this grid)")
    coef = np.einsum("nab,ns,nsb->nsa", np.linalg.inv(normal), w, As) / scale[:, None, :]
    return np.ascontiguousarray(coef), np.ascontiguousarray(qmean)


def source_weights(grid, f: np.ndarray) -> np.ndarray:
    """(N * P,) non-negative weights of the points of ``grid.source_rule`` for the density f: |C| / P
    (f + theta g . offset), g the least-squares gradient of f, theta in [0, 1] the largest keeping every
    weight >= 0 (1 on resolved positive densities). They sum to the cell's mass exactly per cell."""
    pts, off = grid.source_rule
    P = pts.shape[1]
    nb = grid.stencil
    g = np.einsum("nsd,ns->nd", grid.stencil_coef, f[nb] - f[:, None])
    dv = np.einsum("npd,nd->np", off, g)  # (N, P): +- pairs, so the sum over p is 0
    worst = np.abs(dv).max(axis=1)
    theta = np.where(worst > 0, np.minimum(1.0, np.maximum(f, 0.0) / np.where(worst > 0, worst, 1.0)), 0.0)
    w = (grid.areas / P)[:, None] * (f[:, None] + theta[:, None] * dv)
    return np.maximum(w, 0.0).reshape(-1)


@njit(cache=True)
def _inflow_slots(faces, sign, owner, neigh):
    """(slots (N, K) int32, ok): :attr:`Grid.cell_inflow` by a loop over the cells' face slots (an adaptive
    grid makes it at every regrid); ok is False where a face is missing from its other cell's list."""
    N, K = faces.shape
    out = np.empty((N, K), np.int32)
    for i in range(N):
        for k in range(K):
            s = sign[i, k]
            if s == 0:
                out[i, k] = i * K + k
                continue
            fc = faces[i, k]
            j = neigh[fc] if owner[fc] == i else owner[fc]
            slot = -1
            for kk in range(K):
                if faces[j, kk] == fc and sign[j, kk] == -s:
                    slot = kk
                    break
            if slot < 0:
                return out, False
            out[i, k] = j * K + slot
    return out, True


def tangent_frames(xbar: np.ndarray) -> np.ndarray:
    """Orthonormal tangent frames (N, d-1, d) at the directions of the rows of ``xbar``.

    On S^2 (d = 3), away from the z axis: (e_phi, e_theta), which rotations about the z axis carry
    into each other, so cells that such a rotation maps onto each other (HEALPix rings, tensor
    grids) get equal stencil coefficients (:attr:`Grid.stencil_classes`). Otherwise a Householder
    completion of the unit normal.
    """
    n = xbar / np.linalg.norm(xbar, axis=1, keepdims=True)
    N, d = n.shape
    if d == 3:
        rho = np.hypot(n[:, 0], n[:, 1])
        if N and rho.min() > 1e-6:
            zero = np.zeros(N)
            e_phi = np.stack([-n[:, 1] / rho, n[:, 0] / rho, zero], axis=1)
            e_theta = np.stack([n[:, 2] * n[:, 0] / rho, n[:, 2] * n[:, 1] / rho, -rho], axis=1)
            return np.stack([e_phi, e_theta], axis=1)
    return _tangent_basis(n)


def stencil_classes(coef: np.ndarray, rel: float = 1e-12):
    """Group cells whose stencil coefficients agree (symmetric cells), for a smaller coefficient table.

    Parameters
    ----------
    coef : (N, S, t) per-cell coefficients.
    rel : float
        Cells are merged only if every coefficient agrees to ``rel`` times the largest coefficient
        (the coefficients' own rounding is ~1e-13 of it on fine grids).

    Returns
    -------
    cls : (N,) int32
        Class of each cell, numbered by first appearance (so consecutive cells read nearby rows).
    table : (C, S, t)
        One cell's coefficients per class; ``table[cls]`` equals ``coef`` to ``rel``.
    """
    return _stencil_classes(coef, rel)[:2]


def _class_scale(coef: np.ndarray) -> float:
    """The largest coefficient of ``coef`` (1 where there is none or it is 0): :func:`stencil_classes`'s scale."""
    scale = float(np.abs(coef).max()) if coef.size else 1.0
    return scale if scale > 0 else 1.0


def _class_hashes(flat: np.ndarray, scale: float) -> np.ndarray:
    """(n,) int64: each row of ``flat`` (n, k) on a grid of step 1e-9 ``scale``, hashed (row by row: a row's
    hash is the same whatever rows are hashed with it)."""
    # a grid of step 1e-9 relative: symmetric cells (differing by rounding, ~1e-13) share a key unless
    # a value sits on a rounding boundary (then the class is split: harmless, only a larger table)
    key = np.round(flat / (scale * 1e-9)).astype(np.int64)
    # rows to one 64-bit hash (wrapping products with fixed odd multipliers): np.unique of a 1-d array
    # instead of rows (a lexicographic sort, 5x slower). Equal rows hash equal; two different rows that
    # collide would share a class, and the check in _stencil_classes then returns one class per cell
    mult = np.random.default_rng(0x5EED).integers(1, 2 ** 62, key.shape[1], dtype=np.int64) | 1
    with np.errstate(over="ignore"):
        return (key * mult).sum(axis=1) if key.shape[1] else np.zeros(len(flat), np.int64)


def _stencil_classes(coef: np.ndarray, rel: float = 1e-12, known=None):
    """(cls, table, scale, hashes) of :func:`stencil_classes`; ``known``: (scale, hashes, rows) the hashes of
    the rows ``rows`` (a boolean mask) made at ``scale`` before (an adapted grid's kept rows, equal bits),
    used where the scale is the same (the same bits as hashing every row)."""
    N = coef.shape[0]
    flat = coef.reshape(N, -1)
    scale = _class_scale(flat)
    if known is not None and known[0] == scale:
        h = known[1]
        rest = ~known[2]
        if rest.any():
            h[rest] = _class_hashes(flat[rest], scale)
    else:
        h = _class_hashes(flat, scale)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    cls = rank[inverse].astype(np.int32)
    table = np.ascontiguousarray(coef[first[order]])
    if np.abs(table[cls] - coef).max() > rel * scale:  # pragma: no cover - keys equal means within 1e-9
        return np.arange(N, dtype=np.int32), np.ascontiguousarray(coef), scale, h
    return cls, table, scale, h


def _tangent_basis(n: np.ndarray) -> np.ndarray:
    """Orthonormal bases (N, d-1, d) of the planes orthogonal to the unit rows of ``n``."""
    N, d = n.shape
    # Householder reflection mapping e_k (k the coordinate where |n| is smallest... use largest) to n
    k = np.argmax(np.abs(n), axis=1)
    e = np.zeros_like(n)
    e[np.arange(N), k] = 1.0
    s = np.sign(n[np.arange(N), k])
    v = n - s[:, None] * e
    vv = np.einsum("ij,ij->i", v, v)
    eye = np.eye(d)
    H = eye[None] - 2.0 * np.einsum("ni,nj->nij", v, v) / np.where(vv > 0, vv, 1.0)[:, None, None]
    # H maps s e_k to n, so the other columns of H span n's orthogonal complement.
    cols = np.array([[j for j in range(d) if j != kk] for kk in range(d)])[k]  # (N, d-1)
    return np.take_along_axis(np.transpose(H, (0, 2, 1)), cols[:, :, None], axis=1)
