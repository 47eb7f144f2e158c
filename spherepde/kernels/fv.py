"""Finite-volume kernels (Numba). Flat arrays and scalars only; nothing here knows a grid object.

The upwind flux through face f (owner o, neighbour n, Gauss points X_g, weighted normals W_g, normal
velocity moments a_g = v(X_g) . W_g) of the linear reconstruction f_c(x) = f_c + g_c . (x - xbar_c) is

    F_f = sum_{a_g > 0} a_g f_o(X_g) + sum_{a_g < 0} a_g f_n(X_g)
        = P f_o + g_o . MP + Nn f_n + g_n . MN,

with the face moments P = sum_{a_g>0} a_g, MP = sum_{a_g>0} a_g (X_g - xbar_o), and Nn, MN likewise
over a_g < 0 (``mom[f] = (P, MP[0:d], Nn, MN[0:d])``, 2 + 2d numbers). This is exact (no same-sign assumption), and
lets a steady field's moments be computed once.

Positivity limiter (a Zhang-Shu-type scaling g_c <- theta_c g_c, theta in [0, 1], per cell): the outflow
of cell c through each of its faces, q f_c + theta g_c . Q, must be >= 0 (so every inflow is >= 0), and
the total outflow must not exceed OUTFLOW_RATIO (2) times the upwind outflow of the mean, q_tot f_c (the
mean upwind value over the outflow is at most twice the cell mean), nor the cell's content over the
stage, f_c |C| / dt. Then one forward-Euler stage keeps every cell average >= 0, and SSP Runge-Kutta
steps (convex combinations of such stages) keep it too. On resolved positive solutions theta = 1 and
the scheme is second order.

Why two bounds: the second alone makes the flux of a nearly empty cell next to a dense one depend on
dt (as dt -> 0 the cap recedes and the cell's outflow, up to 2e7 times its content per unit time on the
paper's run at beta 100, empties it in a fraction of a step), so the semi-discrete right-hand side is
not a function of the state alone, and an embedded error estimate cannot converge (issue #15: steps
down to 1e-10). The first bound does not depend on dt; for outflow Courant numbers <= 1 / OUTFLOW_RATIO
(the default CFL 0.4 included) it implies the second, so the right-hand side is the same for every
step size. The second stays for larger CFL numbers (positivity for any CFL <= 1).

Why the face bound fades in over faces of small outflow (continuity of the right-hand side): the bound
theta <= q f / (-g . Q) is scale-free in q (Q shrinks with q), so it does not vanish as q -> 0+ but is
absent at q = 0: a hard face bound makes theta jump wherever a face's outflow changes sign. The
right-hand side is then discontinuous in the state, the embedded error stays at a fixed ratio of the
step's change for every dt, and the error control stalls. Seen twice: on a face along which the velocity
is tangent (symmetry planes of the paper's matrices are HEALPix edges; nside 2, uniform f0, beta 5:
386036 steps to t = 0.58), and, with an earlier cure that exempted only faces of q <= 1e-10 q_tot, on
the adaptive Figure 4 runs (beta 30), where the velocity at a Gauss point of a face between a cluster
cell and its tail turns as the cluster moves: the jump moved to q = 1e-10 q_tot, the embedded estimate
stayed at 1.5-3 times the tolerance from dt = 1e-2 down to 1e-8, and 30-45 % of all attempts were
rejected, steps down to 1e-9. Now a face whose outflow share w = q / (FACE_RAMP q_tot) is below 1 sets the
relaxed bound b' = b + (1 - b)(1 - w) (b the face bound above): the full bound for w >= 1, none at
q = 0, and continuous (Lipschitz) in between, so theta is a continuous function of the state and of the
field. Where b' > b the face's reconstructed outflow may be negative; it is clipped at 0 (continuous in
f; mass is still exact since each face's flux is computed once), and in the total-outflow test the face
counts with the chord slope max(g . Q, -q f / b') of its clipped outflow max(q f + theta g . Q, 0) over
theta in [0, b'] (convex, so below its chord): an upper bound for every admissible theta, equal to g . Q
where the outflow stays >= 0 (w >= 1), so both positivity bounds hold. On resolved positive solutions no
face bound is active and nothing changes.

The per-cell kernels store gradients and the cell-major moments Q in each cell's tangent frame
(``Grid.tangent_basis``, d - 1 components): g . Q is the same number in any frame, and d - 1 numbers per
neighbour and per face are fewer bytes to stream. The face-major moments ``mom`` stay in ambient
coordinates.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from .fastexp import fexp_ftz

__all__ = [
    "face_side_moments",
    "face_side_moments_modes",
    "mode_face_tables",
    "side_moments",
    "limited_gradient",
    "face_flux",
    "local_bounds_scale",
    "cell_update",
    "stage_update",
    "face_side_moments_quadratic",
    "stage_update_quadratic",
    "face_side_weights",
    "log_values",
    "stage_update_log",
    "cell_rates",
    "interpolate_to_faces",
    "vector_gradient",
    "attention_normal_weights",
    "moment_width",
    "MAX_DIM",
]

#: Relative safety margin on the limiter's bounds (each face outflow >= margin * q f, total outflow
#: <= (1 - margin) f |C| / dt), so that rounding (1e-16 relative) never produces a negative average.
OUTFLOW_MARGIN = 1e-12
#: The step-independent total-outflow bound of the positivity limiter: outflow <= OUTFLOW_RATIO q_tot f.
OUTFLOW_RATIO = 2.0
#: The positivity limiter's face bound on theta fades in over faces whose upwind outflow q is below
#: FACE_RAMP q_tot of their cell (none at q = 0, in full from FACE_RAMP q_tot on), so that theta, and the
#: right-hand side, is continuous where a face's outflow changes sign (see the module docstring). A face
#: relieved of part of its bound has its outflow clipped at 0 instead. 0.1: a face carrying a tenth of the
#: cell's outflow is bounded in full; the limiter's Lipschitz constant in q is 1 / FACE_RAMP times the
#: flux's own.
FACE_RAMP = 0.1


@njit(inline="always")
def _face_bound(q, fi, gq, ramp):
    """(bound, count) of one face of a cell with mean fi > 0 for the positivity scaling theta: the relaxed
    face bound b' (1.0 where the outflow q fi + theta gq stays >= 0 for every theta in [0, 1]) and the
    face's slope in the total-outflow test, the chord max(gq, -q fi / b') (see the module docstring);
    ``ramp`` = FACE_RAMP q_tot."""
    # q fi >= 0, so a negative outflow implies gq < 0; testing gq < 0 first (a coin flip per face) cost ~25
    # cycles per cell in mispredicted branches, this test is rarely false
    if q * fi + gq >= 0.0:
        return 1.0, gq
    b = (1.0 - OUTFLOW_MARGIN) * q * fi / (-gq)
    if q < ramp:
        b += (1.0 - b) * (1.0 - q / ramp)
    if b <= 0.0:  # q = 0 with no outflow anywhere (ramp 0): Q is 0 too, only rounding gets here
        return 0.0, 0.0
    return b, max(gq, -q * fi / b)


@njit(inline="always")
def _cap_theta(theta, s0, s1, capf, fi):
    """theta within the total-outflow bound: s0 fi + theta s1 <= min(capf, OUTFLOW_RATIO s0) fi, with s0 the
    cell's sum of q, s1 its faces' counts (:func:`_face_bound`) and ``capf`` = (1 - OUTFLOW_MARGIN) |C| / dt
    (see the module docstring)."""
    cap = min(capf, OUTFLOW_RATIO * s0) * fi  # the step-independent bound first
    s0 *= fi
    if s0 + theta * s1 > cap and s1 > 0.0:  # the rare condition first (s1 > 0 is a coin flip)
        theta = min(theta, max(cap - s0, 0.0) / s1)
    return theta


#: Largest ambient dimension the kernels support (scalar accumulators; S^1, S^2, S^3).
MAX_DIM = 4


def moment_width(d: int) -> int:
    """Columns of the face-moment array: (P, MP[0:d], Nn, MN[0:d])."""
    return 2 + 2 * d


@njit(inline="always")
def _store_moments3(mom, f, P, p0, p1, p2, Nn, n0, n1, n2):
    """Row f of the face moments on S^2: (P, MP, Nn, MN)."""
    mom[f, 0] = P
    mom[f, 1] = p0
    mom[f, 2] = p1
    mom[f, 3] = p2
    mom[f, 4] = Nn
    mom[f, 5] = n0
    mom[f, 6] = n1
    mom[f, 7] = n2


@njit(inline="always")
def _point_moments3(ag, pts, f, gg, xo0, xo1, xo2, xn0, xn1, xn2, P, Nn, p0, p1, p2, n0, n1, n2):
    """Add Gauss point gg of face f with weight ag to the S^2 accumulators (branch-free: max(ag, 0) to the
    owner's, min(ag, 0) to the neighbour's); returns them."""
    pos = max(ag, 0.0)
    neg = min(ag, 0.0)
    X0 = pts[f, gg, 0]
    X1 = pts[f, gg, 1]
    X2 = pts[f, gg, 2]
    return (P + pos, Nn + neg, p0 + pos * (X0 - xo0), p1 + pos * (X1 - xo1), p2 + pos * (X2 - xo2),
            n0 + neg * (X0 - xn0), n1 + neg * (X1 - xn1), n2 + neg * (X2 - xn2))


@njit(inline="always")
def _face_ends3(owner, neigh, xbar, f):
    """Owner and neighbour of face f and their mean positions on S^2."""
    o = owner[f]
    n = neigh[f]
    return o, n, xbar[o, 0], xbar[o, 1], xbar[o, 2], xbar[n, 0], xbar[n, 1], xbar[n, 2]


@njit(inline="always")
def _store_face3(mom, side, slots, basis, o, n, f, P, p0, p1, p2, Nn, n0, n1, n2):
    """Row f of the face moments on S^2 and its two slots of the cell-major copy (tangent frames)."""
    _store_moments3(mom, f, P, p0, p1, p2, Nn, n0, n1, n2)
    _store_side3(side, slots, basis, o, n, f, P, p0, p1, p2, Nn, n0, n1, n2)


@njit(inline="always")
def _store_side3(side, slots, basis, o, n, f, P, p0, p1, p2, Nn, n0, n1, n2):
    """The two slots of face f in the cell-major moments on S^2 (tangent frames)."""
    so = slots[f, 0]
    sn = slots[f, 1]
    side[o, so, 0] = P
    side[n, sn, 0] = -Nn
    for t in range(2):
        side[o, so, 1 + t] = basis[o, t, 0] * p0 + basis[o, t, 1] * p1 + basis[o, t, 2] * p2
        side[n, sn, 1 + t] = -(basis[n, t, 0] * n0 + basis[n, t, 1] * n1 + basis[n, t, 2] * n2)


@njit(inline="always")
def _face_row(f, owner, neigh, slots, mom, d):
    """Owner, neighbour and their slots of face f, its row of the face moments zeroed (the general-d loops)."""
    for c2 in range(2 + 2 * d):
        mom[f, c2] = 0.0
    return owner[f], neigh[f], slots[f, 0], slots[f, 1]


@njit(inline="always")
def _add_point_moments(a, a_prev, c, pts, xbar, o, n, f, gg, d, mom):
    """Add Gauss point gg of face f to its row of ``mom`` (the general-d loops); returns the point's
    (max(a, 0), min(a, 0)) of the extrapolated weight a + c (a - a_prev)."""
    ag = a[f, gg]
    ag = ag + c * (ag - a_prev[f, gg])
    pos = max(ag, 0.0)
    neg = min(ag, 0.0)
    mom[f, 0] += pos
    mom[f, 1 + d] += neg
    for k in range(d):
        mom[f, 1 + k] += pos * (pts[f, gg, k] - xbar[o, k])
        mom[f, 2 + d + k] += neg * (pts[f, gg, k] - xbar[n, k])
    return pos, neg


@njit(parallel=True, cache=True)
def face_side_moments(a, a_prev, c, pts, xbar, basis, owner, neigh, slots, mom, side):
    """Face moments ``mom`` (F, 2 + 2d) = (P, MP, Nn, MN) from the normal-velocity weights
    a + c (a - a_prev) (F, G) (linear extrapolation in time, done here on the fly; pass a_prev = a and
    c = 0 for a itself), and in the same pass their cell-major copy ``side`` (N, K, d) in the cells'
    tangent frames ``basis`` (N, d-1, d) (what :func:`side_moments` makes of ``mom``): each face writes
    its row of ``mom`` and its two slots of ``side`` (``slots`` = ``Grid.face_slots``: the slot of the
    face in its owner's and its neighbour's face list). Padding slots of ``side`` are not written (the
    caller zeroes them once).

    Branch-free: each Gauss point adds max(a, 0) to the owner's sums and min(a, 0) to the neighbour's
    (the other side gets an exact 0); a sign test mispredicts wherever the field's sign varies along
    the faces (2x slower at nside 64). S^2 has its own loop with scalar accumulators (d = 3); other d
    accumulate in ``mom``."""
    F, G = a.shape
    d = xbar.shape[1]
    if d == 3:
        for f in prange(F):
            o, n, xo0, xo1, xo2, xn0, xn1, xn2 = _face_ends3(owner, neigh, xbar, f)
            P = Nn = p0 = p1 = p2 = n0 = n1 = n2 = 0.0
            for gg in range(G):
                ag = a[f, gg]
                ag = ag + c * (ag - a_prev[f, gg])
                P, Nn, p0, p1, p2, n0, n1, n2 = _point_moments3(ag, pts, f, gg, xo0, xo1, xo2, xn0, xn1, xn2,
                                                                P, Nn, p0, p1, p2, n0, n1, n2)
            _store_face3(mom, side, slots, basis, o, n, f, P, p0, p1, p2, Nn, n0, n1, n2)
        return
    for f in prange(F):
        o = owner[f]
        n = neigh[f]
        for c2 in range(2 + 2 * d):
            mom[f, c2] = 0.0
        for gg in range(G):
            _add_point_moments(a, a_prev, c, pts, xbar, o, n, f, gg, d, mom)
        so = slots[f, 0]
        sn = slots[f, 1]
        side[o, so, 0] = mom[f, 0]
        side[n, sn, 0] = -mom[f, 1 + d]
        for t in range(d - 1):
            so_t = 0.0
            sn_t = 0.0
            for k in range(d):
                so_t += basis[o, t, k] * mom[f, 1 + k]
                sn_t += basis[n, t, k] * mom[f, 2 + d + k]
            side[o, so, 1 + t] = so_t
            side[n, sn, 1 + t] = -sn_t


@njit(parallel=True, cache=True)
def lerp_moments(b, a, c, out):
    """b + c (b - a) into ``out``, entry by entry over C-contiguous arrays of one shape (any): the moments of
    a field interpolated in time between two nodes (``Options.field_time``), b the later node's moment
    array, a the earlier's and c = (t - t_b) / (t_b - t_a) in [-1, 0], so each entry is the convex
    combination (1 + c) b - c a. Twin: NumPy's ``b + c * (b - a)``, the same bits (no fused multiply-add
    without fastmath).

    What it is for: a stage's moments made from the interpolated normal-velocity weights stream the Gauss
    points, both nodes' weights and the geometry (0.11 s for a pair of stage times at nside 256, one
    thread); combining the two nodes' moments streams only those (0.011 s, 0.014 s for a pair with
    :func:`lerp_moments_pair`; 2026-12-07)."""
    x = b.reshape(-1)
    y = a.reshape(-1)
    p = out.reshape(-1)
    for i in prange(x.size):
        p[i] = x[i] + c * (x[i] - y[i])


@njit(parallel=True, cache=True)
def lerp_moments_pair(b, a, c1, c2, out1, out2):
    """:func:`lerp_moments` at two times in one pass (b and a read once): b + c1 (b - a) into ``out1``,
    b + c2 (b - a) into ``out2``, the same bits as two calls."""
    x = b.reshape(-1)
    y = a.reshape(-1)
    p = out1.reshape(-1)
    q = out2.reshape(-1)
    for i in prange(x.size):
        d = x[i] - y[i]
        p[i] = x[i] + c1 * d
        q[i] = x[i] + c2 * d


@njit(cache=True)
def lerp_max(b, a, c):
    """max over the entries of b + c (b - a) (1-d arrays of one size), without forming it: the largest
    outflow rate and divergence of the cells for moments interpolated in time (:func:`lerp_moments`), from
    the two nodes' per-cell rates (both are linear in the moments). Twin: ``(b + c * (b - a)).max()``."""
    out = -np.inf
    for i in range(b.size):
        v = b[i] + c * (b[i] - a[i])
        if v > out:
            out = v
    return out


@njit(parallel=True, cache=True)
def side_moments(mom, basis, cell_faces, cell_sign, side):
    """Cell-major outflow moments ``side`` (N, K, d): for each cell and each of its faces, (q, Q_t) with
    Q in the cell's tangent frame ``basis`` (N, d-1, d), so that the outflow through the face is
    q f_c + sum_t g_t Q_t for the frame components g_t of the cell's gradient (zeros for padding).

    The limiter reads these contiguously instead of gathering face rows (measured 2x faster).
    """
    N, K = cell_faces.shape
    d = (mom.shape[1] - 2) // 2
    for i in prange(N):
        for k in range(K):
            sg = cell_sign[i, k]
            fc = cell_faces[i, k]
            if sg == 0:
                for c in range(d):
                    side[i, k, c] = 0.0
                continue
            off = 0 if sg > 0 else 1 + d
            side[i, k, 0] = sg * mom[fc, off]
            for t in range(d - 1):
                s = 0.0
                for c in range(d):
                    s += basis[i, t, c] * mom[fc, off + 1 + c]
                side[i, k, 1 + t] = sg * s


@njit(inline="always")
def _ls_gradient(i, f, stencil, base, coef, ci, S, DL):
    """Least-squares gradient of f at cell i in its tangent frame, as scalars (g0, g1, g2) (unused
    components 0), from the coefficient row ``coef[ci]`` (the cell's class). The neighbours are
    ``base + stencil[i]``: base 0 for absolute indices (``Grid.stencil``), i for offsets
    (``Grid.stencil_offsets``)."""
    fi = f[i]
    g0 = 0.0
    g1 = 0.0
    g2 = 0.0
    for k in range(S):
        # unsigned index: numba adds a negative-index wraparound to every signed one (a neighbour index
        # is >= 0); measured 8% on the whole stage kernel, one core
        df = f[uint64(base + stencil[i, k])] - fi
        g0 += coef[ci, k, 0] * df
        if DL > 1:
            g1 += coef[ci, k, 1] * df
        if DL > 2:
            g2 += coef[ci, k, 2] * df
    return g0, g1, g2


@njit(inline="always")
def _side_dot(i, k, side, g0, g1, g2, DL):
    """g_i . Q for face slot k of cell i (frame components, from the cell-major moments ``side``)."""
    gq = g0 * side[i, k, 1]
    if DL > 1:
        gq += g1 * side[i, k, 2]
    if DL > 2:
        gq += g2 * side[i, k, 3]
    return gq


@njit(inline="always")
def _positivity_theta(i, fi, g0, g1, g2, side, capf, K, DL):
    """The positivity scaling theta in [0, 1] of cell i's gradient (see the module docstring);
    ``capf`` = (1 - OUTFLOW_MARGIN) |C_i| / dt; the total-outflow cap is min(capf, OUTFLOW_RATIO sum q) fi."""
    if fi <= 0.0:
        return 0.0
    theta = 1.0
    s0 = 0.0
    for k in range(K):
        s0 += side[i, k, 0]
    ramp = FACE_RAMP * s0
    s1 = 0.0
    for k in range(K):
        b, c = _face_bound(side[i, k, 0], fi, _side_dot(i, k, side, g0, g1, g2, DL), ramp)
        theta = min(theta, b)
        s1 += c
    return _cap_theta(theta, s0, s1, capf, fi)


@njit(inline="always")
def _stage_value(fa_i, fb_i, s, r, alpha, clip):
    """alpha fa + (1 - alpha)(fb - r s) with r = dt/|C|, in increment form when alpha > 0: near a steady
    state the same products would round the same way every step and the mass would drift linearly
    (measured 6e-17 per step with SSP-RK3); here only the small increment is rounded.

    ``clip`` (the positivity limiter is on): a value below 0 is set to 0. The limiter makes the exact
    stage value >= 0, so what is clipped is rounding of a value near 0 (seen: -1.5e-323 at CFL 1 on the
    paper's field, at 6659 of 10^4 steps; issue #21): the mass changes by that much, far below one ulp
    of the total."""
    if alpha == 0.0:
        v = fb_i - r * s
    else:
        v = fa_i + (1.0 - alpha) * ((fb_i - fa_i) - r * s)
    if clip and v < 0.0:
        return 0.0
    return v


@njit(parallel=True, cache=True)
def limited_gradient(f, stencil, cls, coef, basis, side, area, dt, limit, g):
    """Least-squares gradients ``g`` (N, d) of ``f`` in ambient coordinates, scaled by the positivity
    limiter if ``limit``.

    ``coef`` (C, S, d-1) are frame coefficients by class ``cls`` (N,) (``Grid.stencil_classes``, or
    ``arange(N)`` with ``Grid.stencil_coef_local``), ``basis`` (N, d-1, d) the frames; ``side`` are
    the cell-major outflow moments of :func:`side_moments`; ``dt`` is the stage's time step (the limiter
    bounds the outflow over it). Cells with f <= 0 get a zero gradient. d <= 4 (scalar accumulators,
    so the loops allocate nothing).
    """
    N, S = stencil.shape
    K = side.shape[1]
    DL = coef.shape[2]
    d = basis.shape[2]
    for i in prange(N):
        g0, g1, g2 = _ls_gradient(i, f, stencil, 0, coef, cls[i], S, DL)
        if limit:
            theta = _positivity_theta(i, f[i], g0, g1, g2, side, (1.0 - OUTFLOW_MARGIN) * area[i] / dt, K, DL)
            g0 *= theta
            g1 *= theta
            g2 *= theta
        for c in range(d):
            v = g0 * basis[i, 0, c]
            if DL > 1:
                v += g1 * basis[i, 1, c]
            if DL > 2:
                v += g2 * basis[i, 2, c]
            g[i, c] = v


@njit(parallel=True, cache=True)
def local_bounds_scale(f, stencil, offsets, g):
    """Barth-Jespersen scaling of the gradients ``g`` (N, d), in place.

    The reconstruction f_i + g_i . (X - xbar_i) at every face Gauss point of cell i (``offsets``
    (N, K, G, d) = X - xbar_i, zero rows for padding) is kept within [min, max] of f over the cell and
    its stencil neighbours. At a discrete local minimum this forces g_i = 0, so the global minimum of
    the cell averages can only decrease through the cell's own net outflow: the discrete Gronwall bound
    of the minimal-density lemma then holds (to the time integrator's order). Smooth extrema are
    clipped (first order there).
    """
    N, S = stencil.shape
    K, G, d = offsets.shape[1], offsets.shape[2], offsets.shape[3]
    for i in prange(N):
        fi = f[i]
        lo = fi
        hi = fi
        for k in range(S):
            v = f[stencil[i, k]]
            lo = min(lo, v)
            hi = max(hi, v)
        theta = 1.0
        for k in range(K):
            for q in range(G):
                dv = 0.0
                for c in range(d):
                    dv += g[i, c] * offsets[i, k, q, c]
                if dv > 0.0:
                    theta = min(theta, (hi - fi) / dv)
                elif dv < 0.0:
                    theta = min(theta, (lo - fi) / dv)
        for c in range(d):
            g[i, c] *= theta


@njit(parallel=True, cache=True)
def face_flux(f, g, owner, neigh, mom, flux, clip):
    """Upwind fluxes (F,) out of the owner, from cell values ``f`` and (limited) gradients ``g``; with
    ``clip`` each side's outflow is clipped at 0 (the positivity limiter's faces of negligible outflow)."""
    F = owner.shape[0]
    d = g.shape[1]
    for fc in prange(F):
        o = owner[fc]
        n = neigh[fc]
        so = mom[fc, 0] * f[o]
        sn = mom[fc, 1 + d] * f[n]
        for c in range(d):
            so += g[o, c] * mom[fc, 1 + c]
            sn += g[n, c] * mom[fc, 2 + d + c]
        if clip:
            so = max(so, 0.0)
            sn = min(sn, 0.0)
        flux[fc] = so + sn


@njit(parallel=True, cache=True)
def cell_update(fa, fb, flux, cell_faces, cell_sign, area, dt, alpha, out, clip):
    """out = alpha fa + (1 - alpha) (fb - dt/|C| sum_faces sign F): one SSP-RK stage (Shu-Osher form);
    ``clip``: rounding below 0 is set to 0 (see :func:`_stage_value`)."""
    N, K = cell_faces.shape
    for i in prange(N):
        s = 0.0
        for k in range(K):
            s += cell_sign[i, k] * flux[cell_faces[i, k]]
        out[i] = _stage_value(fa[i], fb[i], s, dt / area[i], alpha, clip)


@njit(inline="always")
def _unlimited_outflows(i, fi, g0, g1, g2, side, capf, outflow, lo, hi, K, DL):
    """The positivity limiter's common case, decided without it: if fi > 0 and every face outflow of the
    unscaled reconstruction, q fi + g . Q, is >= 0 and the total-outflow cap does not bind, theta = 1
    (:func:`_positivity_theta` returns exactly 1.0 there: each face's bound is 1.0 and its count g . Q,
    summed in the same order, and :func:`_cap_theta` keeps 1.0), so those outflows, stored at ``lo + k`` (k < 4) and ``hi + k`` (k >= 4), are
    the limited ones to the bit. Returns False (and the caller runs the limiter) otherwise. On smooth
    positive densities this is nearly every cell, and it saves the limiter's second pass over the faces
    (the outflows recomputed from the scaled gradient): the stage kernel 12 % faster at HEALPix nside 256
    (8.3 -> 7.3 ms, 2 cores)."""
    if not fi > 0.0:
        return False
    s0 = 0.0
    s1 = 0.0
    ok = True
    for k in range(K):
        gq = _side_dot(i, k, side, g0, g1, g2, DL)
        o = side[i, k, 0] * fi + gq
        ok = ok and o >= 0.0
        s0 += side[i, k, 0]
        s1 += gq
        outflow[(lo if k < 4 else hi) + k] = max(o, 0.0)  # as the limiter stores it (a -0.0 included)
    # every face bound is 1.0 (_face_bound's first test) and the counts are the g . Q summed above, so the
    # limiter's theta is what the total-outflow test makes of 1.0
    return ok and _cap_theta(1.0, s0, s1, capf, fi) == 1.0


@njit(inline="always")
def _cell_outflows(i, fb, stencil, coef, ci, side, capf, linear, limit, outflow, S, K, DL, KS=-1):
    """Outflows of cell i through each of its faces over one stage, q f_i + theta g_i . Q, into
    outflow[i * KS + k] (gradient, limiter and outflows of pass 1 of :func:`stage_update`); ``stencil``
    holds index offsets (neighbour - i), capf = (1 - OUTFLOW_MARGIN) |C_i| / dt. ``S`` and ``K``: the
    stencil slots and faces looped over (the first ones of the cell's rows); ``KS``: the row width of the
    flat outflow layout (default K)."""
    if KS < 0:
        KS = K
    fi = fb[i]
    g0 = g1 = g2 = 0.0
    if linear:
        g0, g1, g2 = _ls_gradient(i, fb, stencil, i, coef, ci, S, DL)
        if limit and _unlimited_outflows(i, fi, g0, g1, g2, side, capf, outflow, i * KS, i * KS, K, DL):
            return
        if limit:
            theta = _positivity_theta(i, fi, g0, g1, g2, side, capf, K, DL)
            g0 *= theta
            g1 *= theta
            g2 *= theta
    if limit:  # >= 0 already but on faces whose bound is relaxed (see _positivity_theta), clipped there
        for k in range(K):
            outflow[i * KS + k] = max(side[i, k, 0] * fi + _side_dot(i, k, side, g0, g1, g2, DL), 0.0)
    else:
        for k in range(K):
            outflow[i * KS + k] = side[i, k, 0] * fi + _side_dot(i, k, side, g0, g1, g2, DL)


@njit(inline="always")
def _cell_net(i, fa, fb, inflow, outflow, r, alpha, out, K, clip, KS=-1):
    """Pass 2 of :func:`stage_update` for cell i: own outflows minus inflows, then the stage value (``K``
    faces looped over, ``KS`` the row width of the outflow layout, default K)."""
    if KS < 0:
        KS = K
    s = 0.0
    for k in range(K):
        s += outflow[i * KS + k] - outflow[uint64(i * KS + inflow[i, k])]  # unsigned: as in _cell_outflows
    out[i] = _stage_value(fa[i], fb[i], s, r, alpha, clip)


@njit(inline="always")
def _outflows_compact(i, fb, stencil, coef, ci, side, capf, outflow, lo, hi, S, K):
    """Pass 1 of :func:`stage_update_compact` for cell i (linear, positivity limiter, S^2): the outflow of
    face slot k stored at lo + k for k < 4 and at hi + k for the others (the compact outflow layout)."""
    fi = fb[i]
    g0, g1, g2 = _ls_gradient(i, fb, stencil, i, coef, ci, S, 2)
    if _unlimited_outflows(i, fi, g0, g1, g2, side, capf, outflow, lo, hi, K, 2):
        return
    theta = _positivity_theta(i, fi, g0, g1, g2, side, capf, K, 2)
    g0 *= theta
    g1 *= theta
    for k in range(K):
        outflow[(lo if k < 4 else hi) + k] = max(side[i, k, 0] * fi + _side_dot(i, k, side, g0, g1, 0.0, 2), 0.0)


@njit(inline="always")
def _net_compact(i, fa, fb, inpos, row, outflow, lo, hi, r, alpha, out, K):
    """Pass 2 of :func:`stage_update_compact` for cell i: own outflows (at lo + k, k < 4, and hi + k)
    minus the inflows at the absolute positions ``inpos[row]``, then the stage value (clipped at 0)."""
    s = 0.0
    for k in range(K):
        s += outflow[(lo if k < 4 else hi) + k] - outflow[uint64(inpos[row, k])]
    out[i] = _stage_value(fa[i], fb[i], s, r, alpha, True)


@njit(parallel=True, cache=True)
def stage_update_compact(fa, fb, stencil4, stencil_off, cls, coef, side4, side, in4, in_large, area, dt, alpha,
                         small, large, outflow, out):
    """:func:`stage_update` for adaptive HEALPix grids (linear scheme, positivity limiter, S^2), each cell
    looped over its own stencil and faces, on compact rows: the same bits, less memory traffic. The padded
    rows of 12 stencil slots and 8 faces that every cell has in ``stencil_off`` (N, 12) and ``side``
    (N, 8, 3) are what only the few cells next to a refinement boundary (``large``) need; the others
    (``small``: 8 stencil cells, 4 faces) read the compact copies ``stencil4`` (N, 8) and ``side4``
    (N, 4, 3) (``Grid.kernel_compact``), and the outflows are stored 4 a cell (cell i's slot k < 4 at
    4 i + k) plus 4 more for each large cell (its slot k >= 4 at 4 N + 4 j + k - 4, j its place in
    ``large``); ``in4`` (N, 4) and ``in_large`` (len(large), 8) give the absolute position of the inflow
    through each slot. Measured (adaptive grid of one order, all cells small, 2 cores): 1.9x faster than
    the padded rows looped the same way at nside 64, 2.4x at nside 128 (``tests/test_fv_kernels.py``
    checks the bits against :func:`stage_update`)."""
    N = fb.shape[0]
    one = area.shape[0] == 1
    for j in prange(small.shape[0]):
        i = small[j]
        a = area[0] if one else area[i]
        _outflows_compact(i, fb, stencil4, coef, cls[i], side4, (1.0 - OUTFLOW_MARGIN) * a / dt, outflow, 4 * i,
                          4 * i, 8, 4)
    for j in prange(large.shape[0]):
        i = large[j]
        a = area[0] if one else area[i]
        _outflows_compact(i, fb, stencil_off, coef, cls[i], side, (1.0 - OUTFLOW_MARGIN) * a / dt, outflow, 4 * i,
                          4 * N + 4 * j - 4, 12, 8)
    for j in prange(small.shape[0]):
        i = small[j]
        _net_compact(i, fa, fb, in4, i, outflow, 4 * i, 4 * i, dt / (area[0] if one else area[i]), alpha, out, 4)
    for j in prange(large.shape[0]):
        i = large[j]
        _net_compact(i, fa, fb, in_large, j, outflow, 4 * i, 4 * N + 4 * j - 4, dt / (area[0] if one else area[i]),
                     alpha, out, 8)


@njit(parallel=True, cache=True)
def compact_side(side, side4):
    """side4 (N, 4, c) = the first 4 face slots of the cell-major moments ``side`` (N, K, c)
    (:func:`stage_update_compact`)."""
    for i in prange(side.shape[0]):
        for k in range(4):
            for c in range(side.shape[2]):
                side4[i, k, c] = side[i, k, c]


def stage_update(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, linear, limit, outflow, out):
    """One SSP-RK stage, out = alpha fa + (1 - alpha)(fb - dt/|C| div_h F(fb)), in two passes.

    Pass 1, per cell: the (limited, if ``limit``) least-squares gradient of fb in the cell's tangent
    frame (neighbours i + ``stencil_off[i]``, coefficient row ``coef[cls[i]]`` (C, S, d-1):
    ``Grid.stencil_offsets`` and ``Grid.stencil_classes``), or none if not ``linear`` (first-order
    upwind), and the outflow through each face, q f_c + g_c . Q from the cell-major moments ``side``
    (N, K, d) in the same frame (:func:`face_side_moments`), stored at ``outflow[c * K + k]`` (N * K,).
    Pass 2, per cell: own outflows minus the inflows, the outflows stored at i * K + ``inflow_off[i]``
    (``Grid.inflow_offsets``). Each face's flux is computed once, by its upwind cell(s), and enters both
    cells with opposite signs, so mass is conserved exactly; the fluxes equal those of
    :func:`face_flux` with :func:`limited_gradient`. ``area`` (N,), or (1,) for equal-area grids.

    Speed (HEALPix nside 256, 2 cores: 2.2e7 cell-stages/s before these measures): the frame (d - 1
    numbers per neighbour instead of d, one number less per face moment), the class table (67332 rows
    for 786432 cells), int16 offsets and the scalar area cut the bytes per cell and stage from 504 to
    ~260; HEALPix (S = 8, K = 4, d = 3) gets a loop with constant trip counts, and equal areas take
    both divisions per cell out of the loop (together 1.9x the compute rate on one core).

    Each of those branches is its own compiled kernel (``_stage_healpix``, ``_stage_equal_area``,
    ``_stage_adaptive``, ``_stage_general``; the same loops, so the same bits), chosen here: a process
    compiles only the ones its grids use. (First-order or unlimited steps on HEALPix take the equal-area
    kernel: the same arithmetic with the trip counts read at run time, without fastmath the same bits.)
    As one kernel they took 27 s to compile on this machine, and every process paid for all of them (a
    sweep worker, the CLI, a fresh install).
    """
    K = inflow_off.shape[1]
    S = stencil_off.shape[1]
    DL = coef.shape[2]
    args = (fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha)
    if area.shape[0] == 1:
        if S == 8 and K == 4 and DL == 2 and linear and limit:  # HEALPix, the default scheme: constants
            _stage_healpix(*args, outflow, out)
            return
        _stage_equal_area(*args, bool(linear), bool(limit), outflow, out)
        return
    if S == 12 and K == 8 and DL == 2 and linear and limit:  # adaptive HEALPix, the default scheme: constant trips
        _stage_adaptive(*args, outflow, out)
        return
    _stage_general(*args, bool(linear), bool(limit), outflow, out)


@njit(parallel=True, cache=True)
def _stage_healpix(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, outflow, out):
    """:func:`stage_update` on HEALPix (S = 8, K = 4, d = 3, equal areas), linear and limited (the default)."""
    N = inflow_off.shape[0]
    capf = (1.0 - OUTFLOW_MARGIN) * area[0] / dt
    r = dt / area[0]
    for i in prange(N):
        _cell_outflows(i, fb, stencil_off, coef, cls[i], side, capf, True, True, outflow, 8, 4, 2)
    if alpha == 0.0:
        for i in prange(N):
            _cell_net(i, fa, fb, inflow_off, outflow, r, 0.0, out, 4, True)
    else:
        for i in prange(N):
            _cell_net(i, fa, fb, inflow_off, outflow, r, alpha, out, 4, True)


@njit(parallel=True, cache=True)
def _stage_equal_area(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, linear, limit, outflow,
                      out):
    """:func:`stage_update` on any other equal-area grid (``area`` of shape (1,)), or scheme."""
    N, K = inflow_off.shape
    S = stencil_off.shape[1]
    DL = coef.shape[2]
    capf = (1.0 - OUTFLOW_MARGIN) * area[0] / dt
    r = dt / area[0]
    for i in prange(N):
        _cell_outflows(i, fb, stencil_off, coef, cls[i], side, capf, linear, limit, outflow, S, K, DL)
    for i in prange(N):
        _cell_net(i, fa, fb, inflow_off, outflow, r, alpha, out, K, limit)


@njit(parallel=True, cache=True)
def _stage_adaptive(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, outflow, out):
    """:func:`stage_update` on adaptive HEALPix (S = 12, K = 8, d = 3, per-cell areas), linear and limited."""
    N = inflow_off.shape[0]
    for i in prange(N):
        _cell_outflows(i, fb, stencil_off, coef, cls[i], side, (1.0 - OUTFLOW_MARGIN) * area[i] / dt, True,
                       True, outflow, 12, 8, 2)
    for i in prange(N):
        _cell_net(i, fa, fb, inflow_off, outflow, dt / area[i], alpha, out, 8, True)


@njit(parallel=True, cache=True)
def _stage_general(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, linear, limit, outflow, out):
    """:func:`stage_update` with per-cell areas, any stencil."""
    N, K = inflow_off.shape
    S = stencil_off.shape[1]
    DL = coef.shape[2]
    for i in prange(N):
        _cell_outflows(i, fb, stencil_off, coef, cls[i], side, (1.0 - OUTFLOW_MARGIN) * area[i] / dt, linear,
                       limit, outflow, S, K, DL)
    for i in prange(N):
        _cell_net(i, fa, fb, inflow_off, outflow, dt / area[i], alpha, out, K, limit)


@njit(parallel=True, cache=True)
def face_side_moments_quadratic(a, a_prev, c, pts, xbar, basis, qmean, pa, pb, owner, neigh, slots, mom, side):
    """:func:`face_side_moments` for the quadratic reconstruction (``Options(scheme="quadratic")``, any d):
    ``mom`` as there, and ``side`` (N, K, 1 + L + Q) = (q, Q_t, Q2_j) with, for the upwind side of each
    face, Q_t = sum a_g u_t(X_g) and Q2_j = sum a_g (u_s u_t (X_g) - m_j) over the pairs (s, t) =
    (``pa[j]``, ``pb[j]``), u = B (X - xbar) in the cell's tangent frame and m = ``qmean`` of the cell
    (:func:`spherepde.grids.base.quadratic_stencil`), so that the outflow of the reconstruction through
    the face is q f + sum_r r_r side[1 + r]. Zeroes the face's two slots first (padding slots are left
    to the caller)."""
    F, G = a.shape
    d = xbar.shape[1]
    L = d - 1
    Q = pa.shape[0]
    if d == 3:  # S^2: scalar accumulators, branch-free (as face_side_moments); pairs (0,0), (0,1), (1,1)
        for f in prange(F):
            o = owner[f]
            n = neigh[f]
            P = Nn = 0.0
            p0 = p1 = p2 = n0 = n1 = n2 = 0.0  # ambient first moments (for mom)
            pu0 = pu1 = pq0 = pq1 = pq2 = 0.0  # owner frame: u, u u
            nu0 = nu1 = nq0 = nq1 = nq2 = 0.0  # neighbour frame
            for gg in range(G):
                ag = a[f, gg]
                ag = ag + c * (ag - a_prev[f, gg])
                pos = max(ag, 0.0)
                neg = min(ag, 0.0)
                x0 = pts[f, gg, 0] - xbar[o, 0]
                x1 = pts[f, gg, 1] - xbar[o, 1]
                x2 = pts[f, gg, 2] - xbar[o, 2]
                y0 = pts[f, gg, 0] - xbar[n, 0]
                y1 = pts[f, gg, 1] - xbar[n, 1]
                y2 = pts[f, gg, 2] - xbar[n, 2]
                uo0 = basis[o, 0, 0] * x0 + basis[o, 0, 1] * x1 + basis[o, 0, 2] * x2
                uo1 = basis[o, 1, 0] * x0 + basis[o, 1, 1] * x1 + basis[o, 1, 2] * x2
                un0 = basis[n, 0, 0] * y0 + basis[n, 0, 1] * y1 + basis[n, 0, 2] * y2
                un1 = basis[n, 1, 0] * y0 + basis[n, 1, 1] * y1 + basis[n, 1, 2] * y2
                P += pos
                Nn += neg
                p0 += pos * x0
                p1 += pos * x1
                p2 += pos * x2
                n0 += neg * y0
                n1 += neg * y1
                n2 += neg * y2
                pu0 += pos * uo0
                pu1 += pos * uo1
                pq0 += pos * uo0 * uo0
                pq1 += pos * uo0 * uo1
                pq2 += pos * uo1 * uo1
                nu0 += neg * un0
                nu1 += neg * un1
                nq0 += neg * un0 * un0
                nq1 += neg * un0 * un1
                nq2 += neg * un1 * un1
            _store_moments3(mom, f, P, p0, p1, p2, Nn, n0, n1, n2)
            so = slots[f, 0]
            sn = slots[f, 1]
            side[o, so, 0] = P
            side[o, so, 1] = pu0
            side[o, so, 2] = pu1
            side[o, so, 3] = pq0 - P * qmean[o, 0]
            side[o, so, 4] = pq1 - P * qmean[o, 1]
            side[o, so, 5] = pq2 - P * qmean[o, 2]
            side[n, sn, 0] = -Nn
            side[n, sn, 1] = -nu0
            side[n, sn, 2] = -nu1
            side[n, sn, 3] = -(nq0 - Nn * qmean[n, 0])
            side[n, sn, 4] = -(nq1 - Nn * qmean[n, 1])
            side[n, sn, 5] = -(nq2 - Nn * qmean[n, 2])
        return
    for f in prange(F):
        o, n, so, sn = _face_row(f, owner, neigh, slots, mom, d)
        for r in range(1 + L + Q):
            side[o, so, r] = 0.0
            side[n, sn, r] = 0.0
        for gg in range(G):
            pos, neg = _add_point_moments(a, a_prev, c, pts, xbar, o, n, f, gg, d, mom)
            if pos > 0.0:
                cell, sl, w = o, so, pos
            elif neg < 0.0:
                cell, sl, w = n, sn, -neg
            else:
                continue
            side[cell, sl, 0] += w
            for t in range(L):
                u = 0.0
                for k in range(d):
                    u += basis[cell, t, k] * (pts[f, gg, k] - xbar[cell, k])
                side[cell, sl, 1 + t] += w * u
            for j in range(Q):
                ua = 0.0
                ub = 0.0
                for k in range(d):
                    x = pts[f, gg, k] - xbar[cell, k]
                    ua += basis[cell, pa[j], k] * x
                    ub += basis[cell, pb[j], k] * x
                side[cell, sl, 1 + L + j] += w * (ua * ub - qmean[cell, j])


@njit(inline="always")
def _quad_rec(i, f, stencil_off, coef, ci, S, R):
    """The quadratic reconstruction's coefficients r (up to 9: S^3) of cell i as scalars (unused ones
    0): r = sum_k coef[ci, k] (f[i + stencil_off[i, k]] - f[i])."""
    fi = f[i]
    r0 = r1 = r2 = r3 = r4 = r5 = r6 = r7 = r8 = 0.0
    for k in range(S):
        df = f[uint64(i + stencil_off[i, k])] - fi
        r0 += coef[ci, k, 0] * df
        r1 += coef[ci, k, 1] * df
        if R > 2:
            r2 += coef[ci, k, 2] * df
            r3 += coef[ci, k, 3] * df
            r4 += coef[ci, k, 4] * df
        if R > 5:
            r5 += coef[ci, k, 5] * df
            r6 += coef[ci, k, 6] * df
            r7 += coef[ci, k, 7] * df
            r8 += coef[ci, k, 8] * df
    return r0, r1, r2, r3, r4, r5, r6, r7, r8


@njit(parallel=True, cache=True)
def stage_update_quadratic(fa, fb, stencil_off, cls, coef, side, inflow_off, area, dt, alpha, limit, outflow, out):
    """:func:`stage_update` with the quadratic reconstruction (third order; ``coef`` (C, S, R) from
    ``Grid.quadratic_classes``, ``side`` (N, K, 1 + R) from :func:`face_side_moments_quadratic`; R = 2, 5
    or 9 on S^1, S^2, S^3). The positivity limiter is the same Zhang-Shu scaling as for the linear
    reconstruction, of the whole deviation p_i - f_i: each face outflow q f_i + theta (r . Q) >= 0 and
    the total bounded as in :func:`_positivity_theta`, so positivity holds for CFL <= 1 and mass is
    exact (each face's flux computed once)."""
    N, K = inflow_off.shape
    S = stencil_off.shape[1]
    R = coef.shape[2]
    one = area.shape[0] == 1
    if S == 8 and K == 4 and R == 5 and limit:  # HEALPix, the default limiter: constant trip counts
        for i in prange(N):
            _quad_outflows(i, fb, stencil_off, coef, cls[i], side, area[0] if one else area[i], dt, True, outflow,
                           8, 4, 5)
    else:
        for i in prange(N):
            _quad_outflows(i, fb, stencil_off, coef, cls[i], side, area[0] if one else area[i], dt, limit, outflow,
                           S, K, R)
    for i in prange(N):
        _cell_net(i, fa, fb, inflow_off, outflow, dt / (area[0] if one else area[i]), alpha, out, K, limit)


@njit(inline="always")
def _quad_outflows(i, fb, stencil_off, coef, ci, side, a, dt, limit, outflow, S, K, R):
    """Pass 1 of :func:`stage_update_quadratic` for cell i (area ``a``): the outflows into
    outflow[i * K + k]."""
    fi = fb[i]
    r0, r1, r2, r3, r4, r5, r6, r7, r8 = _quad_rec(i, fb, stencil_off, coef, ci, S, R)
    base = i * K
    s0 = 0.0
    for k in range(K):
        gq = r0 * side[i, k, 1] + r1 * side[i, k, 2]
        if R > 2:
            gq += r2 * side[i, k, 3] + r3 * side[i, k, 4] + r4 * side[i, k, 5]
        if R > 5:
            gq += r5 * side[i, k, 6] + r6 * side[i, k, 7] + r7 * side[i, k, 8] + r8 * side[i, k, 9]
        outflow[base + k] = gq
        s0 += side[i, k, 0]
    if not limit:
        for k in range(K):
            outflow[base + k] += side[i, k, 0] * fi
        return
    theta = 1.0
    if fi <= 0.0:
        theta = 0.0
    else:
        ramp = FACE_RAMP * s0
        s1 = 0.0
        for k in range(K):
            b, c = _face_bound(side[i, k, 0], fi, outflow[base + k], ramp)
            theta = min(theta, b)
            s1 += c
        theta = _cap_theta(theta, s0, s1, (1.0 - OUTFLOW_MARGIN) * a / dt, fi)
    for k in range(K):
        outflow[base + k] = max(side[i, k, 0] * fi + theta * outflow[base + k], 0.0)


#: The log-quadratic scheme's floor for f in log f: a cell at 0 (a vMF tail that underflowed) takes log(LOG_FLOOR).
LOG_FLOOR = 1e-300
#: Largest exponent the log-quadratic reconstruction evaluates, relative to its largest value at the cell's
#: quadrature points: a guard against overflow where a wild fit (a cell next to an empty one) rises toward a
#: face; such outflows are then bounded by the stage's outflow cap, not by the reconstruction.
LOG_MAX_EXPONENT = 650.0
#: The log-quadratic scheme's step-independent total-outflow bound: outflow <= LOG_OUTFLOW_RATIO q_tot f_i (see
#: :func:`stage_update_log`): a sub-cell bump at a cell's downstream face leaves it that much faster than the
#: cell mean would. Measured on the bump proxy (nside 64, width 0.012 contracting at rate 1, centroid error at
#: t = 1): 2.94e-3 with 2 (the linear scheme's OUTFLOW_RATIO), 1.69e-3 with 2.5, 1.04e-3 with 4, 9.9e-4 with 8,
#: a step size underflow at t = 0.54 with no such bound. On the clusters of validation/adaptive_clusters
#: (nside_max 1024, largest centroid error at t = 1 / 2 / 3): 1.62e-3 / 1.68e-3 / 1.88e-3 with 4, 1.09e-3 /
#: 1.03e-3 / 1.15e-3 with 8, one rejected step in each run.
LOG_OUTFLOW_RATIO = 8.0
#: Cells per chunk of the log-quadratic stage's parallel loop (one scratch row per chunk).
_LOG_CHUNK = 256


@njit(parallel=True, cache=True)
def face_side_weights(a, a_prev, c, pts, xbar, owner, neigh, slots, mom, wside):
    """The log-quadratic scheme's moments (``Options(scheme="log-quadratic")``): the face moments ``mom``
    (F, 2 + 2d) as :func:`face_side_moments` (the CFL rate and the diagnostics read them), and the cell-major
    outward weights ``wside`` (N, K, G) of the extrapolated weight a + c (a - a_prev) at every Gauss point:
    wside[o, so, g] = a_g, wside[n, sn, g] = -a_g. The scheme's stage (:func:`stage_update_log`) reads the
    weights point by point: its reconstruction is not linear in its coefficients, so no moments summarise a
    face. Padding slots are left to the caller."""
    F, G = a.shape
    d = xbar.shape[1]
    for f in prange(F):
        o, n, so, sn = _face_row(f, owner, neigh, slots, mom, d)
        for gg in range(G):
            pos, neg = _add_point_moments(a, a_prev, c, pts, xbar, o, n, f, gg, d, mom)
            wside[o, so, gg] = pos + neg
            wside[n, sn, gg] = -(pos + neg)


@njit(parallel=True, cache=True)
def log_values(f, y):
    """y = log(max(f, LOG_FLOOR)), the log-quadratic scheme's first pass."""
    for i in prange(f.shape[0]):
        y[i] = np.log(max(f[i], LOG_FLOOR))


@njit(inline="always")
def _frame2(basis, i, x0, x1, x2):
    """u = B_i x in cell i's tangent frame (S^2: two components)."""
    return (basis[i, 0, 0] * x0 + basis[i, 0, 1] * x1 + basis[i, 0, 2] * x2,
            basis[i, 1, 0] * x0 + basis[i, 1, 1] * x1 + basis[i, 1, 2] * x2)


@njit(inline="always")
def _log_outflows(i, fb, y, stencil_off, coef, ci, cell_pts, cell_w, wside, cell_faces, pts, xbar, basis, capf,
                  limit, outflow, buf, S, K, G, Q):
    """Pass 1 of :func:`stage_update_log` for cell i: the outflows through its faces into outflow[i * K + k]."""
    fi = fb[i]
    base = i * K
    if fi <= 0.0:
        for k in range(K):
            outflow[base + k] = 0.0
        return
    r0, r1, r2, r3, r4 = _quad_rec(i, y, stencil_off, coef, ci, S, 5)[:5]  # the quadratic's coefficients of log f
    xb0 = xbar[i, 0]
    xb1 = xbar[i, 1]
    xb2 = xbar[i, 2]
    # the cell mean of exp(L) by the cell rule, shifted by the largest exponent over the cell's points (so
    # exp(L - top) <= 1 and the mean >= the smallest weight); element-wise loops over ``buf`` vectorise
    for q in range(Q):
        u0, u1 = _frame2(basis, i, cell_pts[i, q, 0] - xb0, cell_pts[i, q, 1] - xb1, cell_pts[i, q, 2] - xb2)
        buf[q] = r0 * u0 + r1 * u1 + r2 * u0 * u0 + r3 * u0 * u1 + r4 * u1 * u1
    top = buf[0]
    for q in range(1, Q):
        top = max(top, buf[q])
    for q in range(Q):
        buf[q] = fexp_ftz(buf[q] - top)
    mean = 0.0
    for q in range(Q):
        mean += cell_w[q] * buf[q]
    scale = fi / mean
    tot = 0.0
    s0 = 0.0  # the upwind outflow coefficient of the cell, sum of its positive outward weights
    for k in range(K):  # (every point computed and masked by max(w, 0) instead of the branch: 1.5x the time)
        fc = cell_faces[i, k]
        s = 0.0
        for g in range(G):
            w = wside[i, k, g]
            if w > 0.0:
                s0 += w
                u0, u1 = _frame2(basis, i, pts[fc, g, 0] - xb0, pts[fc, g, 1] - xb1, pts[fc, g, 2] - xb2)
                e = r0 * u0 + r1 * u1 + r2 * u0 * u0 + r3 * u0 * u1 + r4 * u1 * u1 - top
                s += w * fexp_ftz(min(e, LOG_MAX_EXPONENT))
        s *= scale
        outflow[base + k] = s
        tot += s
    if limit:
        cap = min(capf, LOG_OUTFLOW_RATIO * s0) * fi  # the step-independent bound first (see stage_update_log)
        if tot > cap:
            sc = cap / tot
            for k in range(K):
                outflow[base + k] *= sc


@njit(parallel=True, cache=True)
def stage_update_log(fa, fb, y, stencil_off, cls, coef, cell_pts, cell_w, wside, cell_faces, pts, xbar, basis,
                     inflow_off, area, dt, alpha, limit, outflow, out):
    """:func:`stage_update` with the log-quadratic reconstruction (``Options(scheme="log-quadratic")``, S^2).

    In cell i, f(x) = f_i exp(L_i(u)) / <exp(L_i)>_i: u = B_i (x - xbar_i) in the cell's tangent frame, L_i
    the weighted least-squares quadratic of log f_k - log f_i at the stencil's mean positions (``coef``
    (C, S, 5) from ``Grid.log_quadratic_classes``, ``y`` = log f from :func:`log_values`), <.>_i the mean over
    the cell by its quadrature (``cell_pts`` (N, Q, 3), ``cell_w`` (Q,)), so that the cell mean is f_i
    exactly (to the rule). Positive by construction: no limiter scales the reconstruction. A narrow bump (a
    vMF cluster is exp of a linear function of x, nearly a quadratic in u) keeps its shape and position
    inside a cell, where every polynomial reconstruction made positive by scaling smears it (measured:
    ``validation/adaptive_clusters/log_reconstruction.md``).

    The outflow through slot k is the upwind sum of wside[i, k, g] f(X_g) over the face's Gauss points
    ``pts[cell_faces[i, k]]`` where the outward weight (:func:`face_side_weights`) is > 0. With ``limit``,
    a cell's outflows are scaled down together where they would exceed its content over the stage
    (``(1 - OUTFLOW_MARGIN) f_i |C_i| / dt``), so every stage value is >= 0 for any step; each face's flux is
    computed once, by its upwind cell, so mass is exact. Pass 2 is :func:`stage_update`'s.

    The cap has the form of the linear scheme's total-outflow bound (:func:`_cap_theta`):
    min(LOG_OUTFLOW_RATIO q_tot, (1 - OUTFLOW_MARGIN) |C_i| / dt) f_i, q_tot the sum of the cell's positive
    outward weights. The first bound does not depend on dt, so where it is the one that binds the right-hand
    side is a function of the state (and continuous in it): with the dt bound alone, a cell whose sub-cell
    bump sits at its downstream face empties at a rate many times the CFL rate, and the embedded error
    estimate cannot converge (measured on the bump proxy with contraction, nside 64: step size underflow at
    t = 0.54). The second binds only in a cell whose stage Courant number exceeds 1 / LOG_OUTFLOW_RATIO
    (0.125; the default CFL is 0.4) and whose outflow exceeds that rate: it keeps positivity for any step."""
    N, K = inflow_off.shape
    S = stencil_off.shape[1]
    G = wside.shape[2]
    Q = cell_w.shape[0]
    one = area.shape[0] == 1
    n_chunks = (N + _LOG_CHUNK - 1) // _LOG_CHUNK
    for c in prange(n_chunks):  # chunks of cells, each with its scratch row for the cell rule's values
        buf = np.empty(Q)
        for i in range(c * _LOG_CHUNK, min(N, (c + 1) * _LOG_CHUNK)):
            a = area[0] if one else area[i]
            _log_outflows(i, fb, y, stencil_off, coef, cls[i], cell_pts, cell_w, wside, cell_faces, pts, xbar,
                          basis, (1.0 - OUTFLOW_MARGIN) * a / dt, limit, outflow, buf, S, K, G, Q)
    for i in prange(N):
        _cell_net(i, fa, fb, inflow_off, outflow, dt / (area[0] if one else area[i]), alpha, out, K, limit)


@njit(parallel=True, cache=True)
def combine_weights(A, c, out):
    """out (F, G) = sum_k c[k] A[k] for the normal-velocity weights A (K, F, G) of a separable field's
    modes (``Prescribed.separable``)."""
    K, F, G = A.shape
    for f in prange(F):
        for g in range(G):
            s = 0.0
            for k in range(K):
                s += c[k] * A[k, f, g]
            out[f, g] = s


@njit(parallel=True, cache=True)
def second_difference_norms(ap, aa, ab, wp, wa, wb):
    """(sum |wp ap + wa aa + wb ab|, max(sum |ap|, sum |aa|, sum |ab|)) over all entries of three (F, G)
    weight arrays: the L1 norm of a second divided difference (wp, wa, wb its coefficients) and the scale
    it is relative to, in one pass and no temporaries (the node control of ``Options.field_time``)."""
    F, G = aa.shape
    d2 = 0.0
    sp = 0.0
    sa = 0.0
    sb = 0.0
    for f in prange(F):
        for g in range(G):
            x, y, z = ap[f, g], aa[f, g], ab[f, g]
            d2 += abs(wp * x + wa * y + wb * z)
            sp += abs(x)
            sa += abs(y)
            sb += abs(z)
    return d2, max(sp, sa, sb)


def mode_face_tables(A, pts, xbar, owner, neigh, scale):
    """Per face and mode, what :func:`face_side_moments_modes` needs of a separable field's modes A (K, F, G)
    (S^2): W (F, K, 10) = (sum_g A, sum_g A (X_g - xbar_owner) (3), sum_g A (X_g - xbar_neighbour) (3),
    alpha, beta, r). The last three bound the sign of any combination: u_kg = A_kg / scale_fg (``scale`` > 0,
    the size of the point's weighted normal, so u is the normal velocity, smooth along the face where A
    carries the quadrature weights) has the affine fit alpha + beta tau_g (tau_g from -1 to 1 in the
    points' order) with largest residual r, so for any coefficients c every point's sum_k c_k u_kg, whose
    sign is that of sum_k c_k A_kg, lies within sum c alpha -+ (|sum c beta| + sum |c| r). The fit is only a
    bound's centre: the bound holds whatever the points' order. NumPy: computed once per grid and field."""
    K, F, G = A.shape
    off_o = pts - xbar[owner][:, None, :]
    off_n = pts - xbar[neigh][:, None, :]
    tau = np.linspace(-1.0, 1.0, G) if G > 1 else np.zeros(1)
    tt = max(float(tau @ tau), 1.0)
    W = np.empty((F, K, 10))
    for k in range(K):
        W[:, k, 0] = A[k].sum(axis=1)
        W[:, k, 1:4] = np.einsum("fg,fgj->fj", A[k], off_o)
        W[:, k, 4:7] = np.einsum("fg,fgj->fj", A[k], off_n)
        u = A[k] / scale
        alpha = u.mean(axis=1)
        beta = (u - alpha[:, None]) @ tau / tt
        W[:, k, 7] = alpha
        W[:, k, 8] = beta
        # the residual, widened by a relative 1e-12 of u's size: the test must hold after rounding
        W[:, k, 9] = np.abs(u - alpha[:, None] - beta[:, None] * tau[None, :]).max(axis=1) \
            + 1e-12 * np.abs(u).max(axis=1)
    return W


@njit(inline="always")
def _mode_sums3(W, c, f, col):
    """sum_k c[k] (W[f, k, 0], W[f, k, col:col + 3]): a whole face's flux and first moment (col 1: about the
    owner's xbar, col 4: about the neighbour's) for the mode coefficients c."""
    S = 0.0
    m0 = 0.0
    m1 = 0.0
    m2 = 0.0
    for k in range(c.shape[0]):
        ck = c[k]
        S += ck * W[f, k, 0]
        m0 += ck * W[f, k, col]
        m1 += ck * W[f, k, col + 1]
        m2 += ck * W[f, k, col + 2]
    return S, m0, m1, m2


@njit(parallel=True, cache=True)
def face_side_moments_modes(A, W, c, pts, xbar, basis, owner, neigh, slots, mom, side):
    """:func:`face_side_moments` (S^2) for the weights a = sum_k c[k] A[k] of a separable field's modes
    (``Prescribed.separable``), without forming a: a face whose weights cannot change sign for these c
    (the bound of ``W`` = :func:`mode_face_tables`: every point's normal velocity is within sum c alpha -+
    (|sum c beta| + sum |c| r)) is all outflow or all inflow, and its moments are the same combination of the
    modes' whole-face moments (linear in c there); only the faces where the sign may change along the face
    are summed point by point (reading A and the points). The same moments as combine_weights +
    face_side_moments up to rounding (sums in another order)."""
    K, F, G = A.shape
    for f in prange(F):
        o = owner[f]
        n = neigh[f]
        mid = 0.0
        slope = 0.0
        res = 0.0
        for k in range(K):
            ck = c[k]
            mid += ck * W[f, k, 7]
            slope += ck * W[f, k, 8]
            res += abs(ck) * W[f, k, 9]
        spread = abs(slope) + res
        lo = mid - spread
        hi = mid + spread
        P = Nn = p0 = p1 = p2 = n0 = n1 = n2 = 0.0
        if lo >= 0.0:  # outflow along the whole face
            P, p0, p1, p2 = _mode_sums3(W, c, f, 1)
        elif hi <= 0.0:  # inflow along the whole face
            Nn, n0, n1, n2 = _mode_sums3(W, c, f, 4)
        else:  # the sign may change along the face: point by point
            xo0, xo1, xo2 = xbar[o, 0], xbar[o, 1], xbar[o, 2]
            xn0, xn1, xn2 = xbar[n, 0], xbar[n, 1], xbar[n, 2]
            for gg in range(G):
                ag = 0.0
                for k in range(K):
                    ag += c[k] * A[k, f, gg]
                P, Nn, p0, p1, p2, n0, n1, n2 = _point_moments3(ag, pts, f, gg, xo0, xo1, xo2, xn0, xn1, xn2,
                                                                P, Nn, p0, p1, p2, n0, n1, n2)
        _store_face3(mom, side, slots, basis, o, n, f, P, p0, p1, p2, Nn, n0, n1, n2)


@njit(parallel=True, cache=True)
def cell_rates(mom, cell_faces, cell_sign, area, courant_rate, divergence):
    """Per cell: outflow rate sum_faces q / |C| (Courant number per unit time) and discrete div v."""
    N, K = cell_faces.shape
    d = (mom.shape[1] - 2) // 2
    for i in prange(N):
        out = 0.0
        net = 0.0
        for k in range(K):
            sg = cell_sign[i, k]
            if sg == 0:
                continue
            fc = cell_faces[i, k]
            if sg > 0:
                out += mom[fc, 0]
            else:
                out -= mom[fc, 1 + d]
            net += sg * (mom[fc, 0] + mom[fc, 1 + d])
        courant_rate[i] = out / area[i]
        divergence[i] = net / area[i]


@njit(parallel=True, cache=True)
def interpolate_to_faces(m, grad, xbar, owner, neigh, pts, out):
    """Second-order interpolation of a cell-centred vector field to face Gauss points.

    ``m`` (N, k) values at cell mean positions, ``grad`` (N, k, d) their gradients; at each Gauss point
    the mean of the owner's and neighbour's linear extrapolations. ``out`` (F, G, k).
    """
    F, G, d = pts.shape
    k = m.shape[1]
    for fc in prange(F):
        o = owner[fc]
        n = neigh[fc]
        for gg in range(G):
            for c in range(k):
                s = m[o, c] + m[n, c]
                for j in range(d):
                    s += grad[o, c, j] * (pts[fc, gg, j] - xbar[o, j])
                    s += grad[n, c, j] * (pts[fc, gg, j] - xbar[n, j])
                out[fc, gg, c] = 0.5 * s


@njit(parallel=True, cache=True)
def interpolate_to_faces_quadratic(m, mq, centers, basis, pa, pb, owner, neigh, pts, out):
    """Third-order interpolation of a vector field given at the cell centres to the face Gauss points:
    at each point the mean of the owner's and the neighbour's quadratic fits m_i + sum_r mq[i, c, r]
    phi_r(u), u = B_i (X - c_i) in the frame ``basis[i]``, phi = (u_t, then u_s u_t over the pairs
    ``pa``, ``pb``) (``Grid.center_quadratic_coef``). ``out`` (F, G, k)."""
    F, G, d = pts.shape
    k = m.shape[1]
    L = d - 1
    Q = pa.shape[0]
    for fc in prange(F):
        o = owner[fc]
        n = neigh[fc]
        for gg in range(G):
            for c in range(k):
                out[fc, gg, c] = 0.5 * (m[o, c] + m[n, c])
            for side in range(2):
                i = o if side == 0 else n
                # frame coordinates of the point about centre i
                u0 = u1 = u2 = 0.0
                for j in range(d):
                    x = pts[fc, gg, j] - centers[i, j]
                    u0 += basis[i, 0, j] * x
                    if L > 1:
                        u1 += basis[i, 1, j] * x
                    if L > 2:
                        u2 += basis[i, 2, j] * x
                for c in range(k):
                    v = mq[i, c, 0] * u0
                    if L > 1:
                        v += mq[i, c, 1] * u1
                    if L > 2:
                        v += mq[i, c, 2] * u2
                    for q in range(Q):
                        a_ = pa[q]
                        b_ = pb[q]
                        ua = u0 if a_ == 0 else (u1 if a_ == 1 else u2)
                        ub = u0 if b_ == 0 else (u1 if b_ == 1 else u2)
                        v += mq[i, c, L + q] * ua * ub
                    out[fc, gg, c] += 0.5 * v


@njit(parallel=True, cache=True)
def attention_normal_weights(m, grad, xbar, owner, neigh, pts, vtw, a):
    """Normal-velocity weights a (F, G) of v = P_X(V m(X)) at the face Gauss points, with m interpolated
    from cell values as in :func:`interpolate_to_faces`.

    ``vtw`` (F, G, d) = V^T W_g precomputed: since the weighted normal W_g is tangent at X_g,
    P_X(V m) . W = (V m) . W = m . (V^T W).
    """
    F, G, d = pts.shape
    for fc in prange(F):
        o = owner[fc]
        n = neigh[fc]
        for gg in range(G):
            s = 0.0
            for c in range(d):
                mc = m[o, c] + m[n, c]
                for j in range(d):
                    mc += grad[o, c, j] * (pts[fc, gg, j] - xbar[o, j])
                    mc += grad[n, c, j] * (pts[fc, gg, j] - xbar[n, j])
                s += 0.5 * mc * vtw[fc, gg, c]
            a[fc, gg] = s


@njit(parallel=True, cache=True)
def vector_gradient_at(m, cells, stencil, coef, grad):
    """:func:`vector_gradient` at the cells ``cells`` alone (grad[cells] written, the other rows left as
    they are): the same sums in the same order, so the same bits as the rows of the whole."""
    S = stencil.shape[1]
    k = m.shape[1]
    d = coef.shape[2]
    for r in prange(cells.shape[0]):
        i = cells[r]
        for c in range(k):
            for j in range(d):
                s = 0.0
                for q in range(S):
                    s += coef[i, q, j] * (m[stencil[i, q], c] - m[i, c])
                grad[i, c, j] = s


def vector_gradient(m, stencil, coef, grad):
    """Unlimited least-squares gradients ``grad`` (N, k, d) of each column of ``m`` (N, k):
    :func:`vector_gradient_at` at every cell."""
    vector_gradient_at(m, np.arange(stencil.shape[0], dtype=np.int64), stencil, coef, grad)


@njit(parallel=True)
def compiled_normal_weights(kernel, pts, normals, t, a):
    """a[f, g] = P_x v(x, t) . N_fg at every face Gauss point x = pts[f, g] (F, G, d), for a Numba-compiled
    velocity ``kernel(x, t, out)`` (x and out (d,)): the normal-velocity weights of a time-dependent
    prescribed field (``Prescribed.compiled``) in one compiled pass, no (F, G, d) temporaries. Returns the
    number of weights that are NaN or inf. Not cached on disk (the kernel is an argument: one compilation
    per user function and process)."""
    F, G, d = pts.shape
    nchunk = (F + 255) // 256
    bad = 0
    for c in prange(nchunk):
        x = np.empty(d)
        v = np.empty(d)
        for f in range(c * 256, min(F, c * 256 + 256)):
            for g in range(G):
                for k in range(d):
                    x[k] = pts[f, g, k]
                kernel(x, t, v)
                xv = 0.0
                for k in range(d):
                    xv += x[k] * v[k]
                s = 0.0
                for k in range(d):
                    s += (v[k] - xv * x[k]) * normals[f, g, k]
                a[f, g] = s
                if s - s != 0.0:  # NaN or inf
                    bad += 1
    return bad


@njit(parallel=True)
def compiled_points(kernel, x, t, out):
    """out[i] = kernel(x[i], t) for points x (n, d): ``Prescribed.compiled``'s velocity(x, t) for particles
    and plots."""
    n, d = x.shape
    nchunk = (n + 255) // 256
    for c in prange(nchunk):
        xi = np.empty(d)
        vi = np.empty(d)
        for i in range(c * 256, min(n, c * 256 + 256)):
            for k in range(d):
                xi[k] = x[i, k]
            kernel(xi, t, vi)
            for k in range(d):
                out[i, k] = vi[k]
