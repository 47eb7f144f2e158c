"""Every finite-volume Numba kernel against a plain NumPy twin written from the definitions."""
import numpy as np
import pytest

from spherepde.grids import HealpixGrid
from spherepde.kernels import fv
from spherepde.models import ZeroTemperature

RNG = np.random.default_rng(42)


@pytest.fixture(scope="module")
def setup():
    g = HealpixGrid(4)
    model = ZeroTemperature(np.array([[1.0, 0.3, 0.0], [0.1, -1.0, 0.2], [0.0, 0.4, 0.8]]),
                            np.array([[0.5, 0.2, -0.1], [0.3, 1.0, 0.0], [0.2, 0.1, -1.5]]))
    F, G, d = g.face_points.shape
    v = model.velocity(g.face_points.reshape(-1, 3)).reshape(F, G, 3)
    a = np.einsum("fgk,fgk->fg", v, g.face_normals)
    f = np.exp(RNG.normal(size=g.n_cells))  # positive, rough: the limiter is active somewhere
    f[RNG.random(g.n_cells) < 0.1] = 0.0
    return g, a, f


def twin_moments(g, a):
    off_o = g.face_points - g.xbar[g.owner][:, None, :]
    off_n = g.face_points - g.xbar[g.neighbour][:, None, :]
    ap, an = np.where(a > 0, a, 0.0), np.where(a > 0, 0.0, a)
    return np.concatenate([ap.sum(1)[:, None], np.einsum("fg,fgk->fk", ap, off_o),
                           an.sum(1)[:, None], np.einsum("fg,fgk->fk", an, off_n)], axis=1)


def twin_gradient(g, f, mom, dt, limit):
    grad = np.einsum("nsd,ns->nd", g.stencil_coef, f[g.stencil] - f[:, None])
    if not limit:
        return grad
    own = g.cell_face_sign > 0
    fc = g.cell_faces
    q = np.where(own, mom[fc, 0], -mom[fc, 4])
    Q = np.where(own[..., None], mom[fc][..., 1:4], -mom[fc][..., 5:8])
    gq = np.einsum("nkd,nd->nk", Q, grad)
    q = np.where(g.cell_face_sign == 0, 0.0, q)
    gq = np.where(g.cell_face_sign == 0, 0.0, gq)
    theta = np.ones(g.n_cells)
    for i in range(g.n_cells):
        if f[i] <= 0:
            theta[i] = 0.0
            continue
        ramp = fv.FACE_RAMP * q[i].sum()
        gq_tot = gq[i].copy()
        for k in range(fc.shape[1]):
            if q[i, k] * f[i] + gq[i, k] < 0:  # a negative outflow at theta = 1: bounded, in part below the ramp
                b = (1 - fv.OUTFLOW_MARGIN) * q[i, k] * f[i] / -gq[i, k]
                w = min(q[i, k] / ramp, 1.0) if ramp > 0 else 1.0
                b = 1 - w * (1 - b)  # b where w = 1, 1 (no bound) at q = 0
                theta[i] = min(theta[i], b)
                # the chord of the clipped outflow max(q f + theta gq, 0) over [0, b]
                gq_tot[k] = max(gq[i, k], -q[i, k] * f[i] / b) if b > 0 else 0.0
        cap = min((1 - fv.OUTFLOW_MARGIN) * g.areas[i] / dt, fv.OUTFLOW_RATIO * q[i].sum()) * f[i]
        s0, s1 = q[i].sum() * f[i], gq_tot.sum()  # the kernel reads q, Q from side_moments
        if s1 > 0 and s0 + theta[i] * s1 > cap:
            theta[i] = min(theta[i], max(cap - s0, 0) / s1)
    return grad * theta[:, None]


def twin_flux_pointwise(g, a, f, grad, clip=False):
    """Upwind flux from the reconstruction evaluated at each Gauss point (no moments). ``clip``: each
    side's outflow through the face at 0, as the positivity limiter does on faces whose bound it relaxes."""
    ro = f[g.owner][:, None] + np.einsum("fgk,fk->fg", g.face_points - g.xbar[g.owner][:, None], grad[g.owner])
    rn = f[g.neighbour][:, None] + np.einsum("fgk,fk->fg", g.face_points - g.xbar[g.neighbour][:, None],
                                              grad[g.neighbour])
    out_o = np.sum(np.where(a > 0, a * ro, 0.0), axis=1)
    out_n = np.sum(np.where(a > 0, 0.0, -a * rn), axis=1)
    if clip:
        out_o, out_n = np.maximum(out_o, 0.0), np.maximum(out_n, 0.0)
    return out_o - out_n


def _face_side(g, a, a_prev, c):
    mom = np.empty((g.n_faces, fv.moment_width(g.dim)))
    side = np.full(g.cell_faces.shape + (g.dim,), np.nan)
    side[g.cell_face_sign == 0] = 0.0  # the caller's part: padding slots
    fv.face_side_moments(a, a_prev, c, g.face_points, g.xbar, g.tangent_basis, g.owner, g.neighbour,
                         g.face_slots, mom, side)
    return mom, side


def test_lerp_moments_equal_their_numpy_twin():
    # the time interpolation of moment arrays (Options.field_time) against NumPy's b + c (b - a) to the last
    # bit, on a face-moment and a cell-major array (tensor grid: padding slots, zeros, stay zeros); the pair
    # kernel equals two single calls, each time's result in its own array (a kernel that wrote the first
    # time's values into both fails); and the combination is convex: nonnegative outflows stay nonnegative
    from spherepde.grids import TensorGrid

    for g in (HealpixGrid(4), TensorGrid(3, 8)):
        F, G = g.face_points.shape[:2]
        (ma, sa), (mb, sb) = (_face_side(g, RNG.normal(size=(F, G)), RNG.normal(size=(F, G)), 0.0) for _ in "ab")
        for b, a in ((mb, ma), (sb, sa)):
            for c in (-1.0, -0.3, 0.0):
                out = np.full_like(b, np.nan)
                fv.lerp_moments(b, a, c, out)
                assert np.array_equal(out, b + c * (b - a))
            o1, o2 = np.full_like(b, np.nan), np.full_like(b, np.nan)
            fv.lerp_moments_pair(b, a, -0.3, -0.8, o1, o2)
            assert np.array_equal(o1, b + -0.3 * (b - a)) and np.array_equal(o2, b + -0.8 * (b - a))
        assert np.all(sa[..., 0] >= 0) and np.all(sb[..., 0] >= 0)  # slot 0: the cell's outflow through the face
        out = np.empty_like(sb)
        for c in np.linspace(-1.0, 0.0, 11):
            fv.lerp_moments(sb, sa, c, out)
            assert np.all(out[..., 0] >= 0)
        assert np.all(out[g.cell_face_sign == 0] == 0.0)


def test_interpolated_rates_equal_the_rates_of_interpolated_moments():
    # an interpolated moment set (Options.field_time) takes its CFL rate and divergence from the two nodes'
    # per-cell rates (fv.lerp_max), not from face moments it does not have: both are sums of the moments over
    # the cell's faces, so they equal cell_rates of the interpolated face moments up to the rounding of those
    # sums (a few ulps of the largest term: 1e-13 relative to the rates' scale, and measured 1e-16-1e-15);
    # a lerp with the nodes swapped or c's sign flipped is off by O(1) here
    from spherepde.grids import TensorGrid

    for g in (HealpixGrid(4), TensorGrid(3, 8)):
        F, G = g.face_points.shape[:2]
        nodes = [_face_side(g, RNG.normal(size=(F, G)), RNG.normal(size=(F, G)), 0.0)[0] for _ in "ab"]
        cells = []
        for mom in nodes:
            rate, div = np.empty(g.n_cells), np.empty(g.n_cells)
            fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, div)
            cells.append((rate, div))
        (ra, da), (rb, db) = cells
        scale = max(np.abs(ra).max(), np.abs(da).max(), np.abs(rb).max(), np.abs(db).max())
        m, rate, div = np.empty_like(nodes[0]), np.empty(g.n_cells), np.empty(g.n_cells)
        for c in (-1.0, -0.7, -0.25, 0.0):
            fv.lerp_moments(nodes[1], nodes[0], c, m)
            fv.cell_rates(m, g.cell_faces, g.cell_face_sign, g.areas, rate, div)
            assert abs(fv.lerp_max(rb, ra, c) - rate.max()) <= 1e-13 * scale
            assert abs(fv.lerp_max(db, da, c) - div.max()) <= 1e-13 * scale
            assert fv.lerp_max(rb, ra, c) == (rb + c * (rb - ra)).max()  # the NumPy twin, to the bit


def _side(g, mom):
    side = np.empty(g.cell_faces.shape + (g.dim,))
    fv.side_moments(mom, g.tangent_basis, g.cell_faces, g.cell_face_sign, side)
    return side


def _limited_gradient(g, f, side, dt, limit, out, classes=True):
    cls, coef = g.stencil_classes if classes else (np.arange(g.n_cells, dtype=np.int32), g.stencil_coef_local)
    fv.limited_gradient(f, g.stencil, cls, coef, g.tangent_basis, side, g.areas, dt, limit, out)


def _stage(g, fa, f, side, dt, alpha, linear, limit, outflow, out, classes=True):
    # classes=False: per-cell coefficients and the per-cell area array (the kernel's general branch);
    # True: the class table and, on HEALPix, the scalar area (the branch with constant trip counts)
    if classes:
        cls, coef, area = *g.stencil_classes, g.kernel_areas
    else:
        cls, coef, area = np.arange(g.n_cells, dtype=np.int32), g.stencil_coef_local, g.areas
    fv.stage_update(fa, f, g.stencil_offsets, cls, coef, side, g.inflow_offsets, area, dt, alpha,
                    linear, limit, outflow, out)


def test_face_moments(setup):
    g, a, f = setup
    mom, _ = _face_side(g, a, a, 0.0)
    assert np.allclose(mom, twin_moments(g, a), rtol=1e-13, atol=1e-16)
    # with the on-the-fly extrapolation a + c (a - a_prev): the moments of the extrapolated weights (the
    # sign split makes them nonlinear in a, so this is not the extrapolation of the moments)
    a_prev = a + 0.3 * RNG.normal(size=a.shape) * np.abs(a).max()
    mom, _ = _face_side(g, a, a_prev, 0.7)
    ext = a + 0.7 * (a - a_prev)
    assert np.allclose(mom, twin_moments(g, ext), rtol=1e-13, atol=1e-16)
    assert np.any(np.sign(ext) != np.sign(a))  # the case exercises sign changes


@pytest.mark.parametrize("limit", [False, True])
def test_limited_gradient(setup, limit):
    g, a, f = setup
    mom = twin_moments(g, a)
    dt = 0.9 / np.max(np.abs(a).sum(1))  # a large step so the total-outflow bound binds somewhere
    out = np.empty((g.n_cells, 3))
    side = _side(g, mom)
    ref = twin_gradient(g, f, mom, dt, limit)
    for classes in (True, False):
        _limited_gradient(g, f, side, dt, limit, out, classes)
        assert np.allclose(out, ref, rtol=1e-12, atol=1e-14)
    if limit:  # the limiter did something (else this test could not fail on it)
        assert np.any(np.abs(ref - twin_gradient(g, f, mom, dt, False)) > 1e-6)


def test_face_flux_matches_pointwise_upwind(setup):
    g, a, f = setup
    mom = twin_moments(g, a)
    grad = RNG.normal(size=(g.n_cells, 3))
    flux = np.empty(g.n_faces)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux, False)
    assert np.allclose(flux, twin_flux_pointwise(g, a, f, grad), rtol=1e-12, atol=1e-14)


def test_cell_update_and_rates(setup):
    g, a, f = setup
    mom = twin_moments(g, a)
    flux = RNG.normal(size=g.n_faces)
    fb = RNG.random(g.n_cells)
    out = np.empty(g.n_cells)
    fv.cell_update(f, fb, flux, g.cell_faces, g.cell_face_sign, g.areas, 0.01, 0.25, out, False)
    net = np.zeros(g.n_cells)
    np.add.at(net, g.owner, flux)
    np.add.at(net, g.neighbour, -flux)
    ref = 0.25 * f + 0.75 * (fb - 0.01 * net / g.areas)
    assert np.allclose(out, ref, rtol=1e-13, atol=1e-15)
    rate, div = np.empty(g.n_cells), np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, div)
    outflow = np.zeros(g.n_cells)
    np.add.at(outflow, g.owner, np.where(a > 0, a, 0).sum(1))
    np.add.at(outflow, g.neighbour, np.where(a < 0, -a, 0).sum(1))
    netv = np.zeros(g.n_cells)
    np.add.at(netv, g.owner, a.sum(1))
    np.add.at(netv, g.neighbour, -a.sum(1))
    assert np.allclose(rate, outflow / g.areas, rtol=1e-13)
    assert np.allclose(div, netv / g.areas, rtol=1e-12, atol=1e-12)


def test_vector_gradient_and_interpolation(setup):
    g, a, f = setup
    m = RNG.normal(size=(g.n_cells, 3))
    grad = np.empty((g.n_cells, 3, 3))
    fv.vector_gradient(m, g.stencil, g.stencil_coef, grad)
    ref = np.einsum("nsd,nsc->ncd", g.stencil_coef, m[g.stencil] - m[:, None, :])
    assert np.allclose(grad, ref, rtol=1e-13, atol=1e-14)
    out = np.empty(g.face_points.shape)
    fv.interpolate_to_faces(m, grad, g.xbar, g.owner, g.neighbour, g.face_points, out)
    eo = m[g.owner][:, None] + np.einsum("fcd,fgd->fgc", grad[g.owner], g.face_points - g.xbar[g.owner][:, None])
    en = m[g.neighbour][:, None] + np.einsum("fcd,fgd->fgc", grad[g.neighbour],
                                             g.face_points - g.xbar[g.neighbour][:, None])
    assert np.allclose(out, 0.5 * (eo + en), rtol=1e-13, atol=1e-14)


def test_vector_gradient_at_some_cells_is_those_rows_of_all(setup):
    """fv.vector_gradient_at (the gradients a regrid remakes at the cells next to its dirty faces): the rows
    of fv.vector_gradient at those cells to the bit, the other rows untouched."""
    g, a, f = setup
    m = RNG.normal(size=(g.n_cells, 3))
    full = np.empty((g.n_cells, 3, 3))
    fv.vector_gradient(m, g.stencil, g.stencil_coef, full)
    cells = np.sort(RNG.choice(g.n_cells, g.n_cells // 7, replace=False)).astype(np.int64)
    part = np.full((g.n_cells, 3, 3), np.nan)
    fv.vector_gradient_at(m, cells, g.stencil, g.stencil_coef, part)
    assert np.array_equal(part[cells], full[cells])
    rest = np.ones(g.n_cells, bool)
    rest[cells] = False
    assert np.isnan(part[rest]).all()


def test_positivity_of_one_limited_euler_stage(setup):
    """The limiter's promise: one forward-Euler stage at outflow Courant number 1 keeps f >= 0."""
    g, a, f = setup
    mom = twin_moments(g, a)
    rate = np.empty(g.n_cells)
    div = np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, div)
    dt = 1.0 / rate.max()
    grad = np.empty((g.n_cells, 3))
    side = _side(g, mom)
    _limited_gradient(g, f, side, dt, True, grad)
    flux = np.empty(g.n_faces)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux, True)
    out = np.empty(g.n_cells)
    fv.cell_update(f, f, flux, g.cell_faces, g.cell_face_sign, g.areas, dt, 0.0, out, False)  # no clip: the
    # limiter alone must give >= 0 here (values far from rounding)
    assert out.min() >= 0.0
    # without the limiter the same stage goes negative (so the test above can fail)
    _limited_gradient(g, f, side, dt, False, grad)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux, False)
    fv.cell_update(f, f, flux, g.cell_faces, g.cell_face_sign, g.areas, dt, 0.0, out, False)
    assert out.min() < 0.0


def test_local_bounds_scale(setup):
    g, a, f = setup
    grad = RNG.normal(size=(g.n_cells, 3)) * 0.3
    off = g.face_points[g.cell_faces] - g.xbar[:, None, None, :]
    off[g.cell_face_sign == 0] = 0.0
    out = grad.copy()
    fv.local_bounds_scale(f, g.stencil, np.ascontiguousarray(off), out)
    lo = np.minimum(f, f[g.stencil].min(axis=1))
    hi = np.maximum(f, f[g.stencil].max(axis=1))
    dv = np.einsum("nkgd,nd->nkg", off, grad)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(dv > 0, (hi - f)[:, None, None] / dv, np.where(dv < 0, (lo - f)[:, None, None] / dv, np.inf))
    theta = np.minimum(1.0, r.reshape(g.n_cells, -1).min(axis=1))
    assert np.allclose(out, grad * theta[:, None], rtol=1e-13, atol=1e-15)
    vals = f[:, None, None] + np.einsum("nkgd,nd->nkg", off, out)
    assert np.all(vals >= lo[:, None, None] - 1e-14) and np.all(vals <= hi[:, None, None] + 1e-14)
    assert np.any(theta < 1)  # the bound was active somewhere


@pytest.mark.parametrize("linear,limit", [(False, False), (True, False), (True, True)])
def test_stage_update_matches_twins(setup, linear, limit):
    """The fused stage kernel (outflows per cell, then inflows gathered through Grid.cell_inflow)
    equals the NumPy twins: gradient (limited or not, zero for upwind), pointwise upwind face fluxes
    at the Gauss points, then the Shu-Osher stage. rtol 1e-12: the twins sum in another order."""
    g, a, f = setup
    mom = twin_moments(g, a)
    rate = np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, np.empty(g.n_cells))
    dt = 0.9 / rate.max()  # large: the total-outflow bound of the limiter binds somewhere
    side = _side(g, mom)
    fa = RNG.random(g.n_cells)
    out = np.empty(g.n_cells)
    outflow = np.empty(g.cell_faces.size)
    grad = twin_gradient(g, f, mom, dt, limit) if linear else np.zeros((g.n_cells, 3))
    flux = twin_flux_pointwise(g, a, f, grad, clip=limit)
    net = np.zeros(g.n_cells)
    np.add.at(net, g.owner, flux)
    np.add.at(net, g.neighbour, -flux)
    ref = 0.25 * fa + 0.75 * (f - dt * net / g.areas)
    # per-cell coefficients and the class table (the HEALPix loop with constant trip counts either way)
    _stage(g, fa, f, side, dt, 0.25, linear, limit, outflow, out, classes=False)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-13)
    _stage(g, fa, f, side, dt, 0.25, linear, limit, outflow, out)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-13)
    # conservation: the outflow slots and the inflow gather cancel in the total
    assert abs(np.sum((out - 0.25 * fa) * g.areas) - 0.75 * np.sum(f * g.areas)) < 1e-13
    if limit:  # one forward-Euler stage at this dt keeps f >= 0 with the limiter, not without
        ref0 = f - dt * net / g.areas  # the twins' stage, unclipped
        assert ref0.min() > -1e-14 * f.max()  # >= 0 up to rounding by the limiter itself
        _stage(g, f, f, side, dt, 0.0, True, True, outflow, out)
        assert out.min() >= 0.0  # and the kernel clips the rounding: exactly >= 0 ...
        assert np.allclose(out, np.maximum(ref0, 0.0), rtol=1e-12, atol=1e-13)  # ... and nothing more
        _stage(g, f, f, side, dt, 0.0, True, False, outflow, out)
        assert out.min() < 0.0


def _inflow_grids():
    from spherepde import AdaptiveHealpixGrid
    from spherepde.grids import TensorGrid

    patch = AdaptiveHealpixGrid(2, 16, refinement=False).refined_where(lambda g: g.centers[:, 2] > 0.6)
    return (HealpixGrid(1), HealpixGrid(3), TensorGrid(3, 6), TensorGrid(2, 5), TensorGrid(4, 4), patch)


def test_cell_inflow_is_an_involution():
    """Slot k of cell i and its inflow slot name the same face from both sides (an adaptive patch too:
    coarse cells with two sub-faces on a side)."""
    for g in _inflow_grids():
        flat = g.cell_inflow.ravel()
        real = g.cell_face_sign.ravel() != 0
        K = g.cell_faces.shape[1]
        assert np.array_equal(flat[flat][real], np.arange(flat.size)[real])
        assert np.array_equal(g.cell_faces.ravel()[flat][real], g.cell_faces.ravel()[real])
        assert np.array_equal(g.cell_face_sign.ravel()[flat][real], -g.cell_face_sign.ravel()[real])
        assert np.array_equal(flat[~real], np.arange(flat.size)[~real])
        assert np.all(flat[real] // K != np.arange(flat.size)[real] // K)


def test_cell_inflow_numba_equals_numpy_twin():
    """The Numba loop of Grid.cell_inflow gives its NumPy twin's table, slot for slot."""
    for g in _inflow_grids():
        assert np.array_equal(g.cell_inflow, g._cell_inflow_numpy())


def _grids_with_padding():
    from spherepde.grids import TensorGrid

    # the tensor grids' polar cells have padding slots; d = 2 and 4 take the kernel's generic loop
    return [HealpixGrid(4), TensorGrid(3, 8), TensorGrid(2, 12), TensorGrid(4, 4)]


@pytest.mark.parametrize("grid", _grids_with_padding(), ids=["healpix", "tensor3", "tensor2", "tensor4"])
def test_face_side_moments_every_dimension(grid):
    # the face moments against the NumPy twin (rtol 1e-13: the twin sums in another order), and the
    # cell-major slots written in the same pass equal to the last bit what side_moments makes of those
    # moments (a copy with signs), padding slots left as the caller set them
    F, G = grid.face_points.shape[:2]
    a = RNG.normal(size=(F, G))
    a_prev = RNG.normal(size=(F, G))
    d = grid.dim
    for c in (0.0, 0.6):
        mom, side = _face_side(grid, a, a_prev, c)
        assert np.allclose(mom, twin_moments(grid, a + c * (a - a_prev)), rtol=1e-13, atol=1e-15)
        ref = np.empty_like(side)
        fv.side_moments(mom, grid.tangent_basis, grid.cell_faces, grid.cell_face_sign, ref)
        assert np.array_equal(side, ref)
        # the frame components are the ambient moments projected on the tangent frame (NumPy twin)
        own = grid.cell_face_sign > 0
        fc = grid.cell_faces
        Q = np.where(own[..., None], mom[fc][..., 1:1 + d], -mom[fc][..., 2 + d:])
        Q = np.einsum("nkc,ntc->nkt", Q, grid.tangent_basis)
        real = grid.cell_face_sign != 0
        assert np.allclose(side[..., 1:][real], Q[real], rtol=1e-13, atol=1e-15)
    assert mom.shape[1] == 2 + 2 * d
    if not isinstance(grid, HealpixGrid) and grid.dim > 2:
        assert (grid.cell_face_sign == 0).any()  # the case covers padding slots


def _adaptive_grid():
    from spherepde.grids.adaptive import AdaptiveHealpixGrid

    g = AdaptiveHealpixGrid(4, 16, refinement=False).refined_where(lambda gr: gr.centers[:, 2] > 0.5)
    assert (g.stencil.shape[1], g.cell_faces.shape[1]) == (12, 8)  # the adaptive branch, constant trips
    return g


@pytest.mark.parametrize("grid_kind", ["tensor", "adaptive"])
def test_stage_update_generic_loop_matches_twins(grid_kind):
    """The stage kernel's loops other than HEALPix's (trip counts from the arrays: a tensor grid of S^2,
    whose stencils and face lists differ from HEALPix's 8 and 4; and the adaptive HEALPix grid's 12 and 8,
    mixed cells with per-cell areas) against the same NumPy twins."""
    from spherepde.grids import TensorGrid

    g = TensorGrid(3, 8) if grid_kind == "tensor" else _adaptive_grid()
    assert (g.stencil.shape[1], g.cell_faces.shape[1]) != (8, 4)
    model = ZeroTemperature(np.array([[1.0, 0.3, 0.0], [0.1, -1.0, 0.2], [0.0, 0.4, 0.8]]), np.eye(3))
    F, G, d = g.face_points.shape
    a = np.einsum("fgk,fgk->fg", model.velocity(g.face_points.reshape(-1, 3)).reshape(F, G, 3), g.face_normals)
    f = np.exp(RNG.normal(size=g.n_cells))
    mom = twin_moments(g, a)
    rate = np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, np.empty(g.n_cells))
    dt = 0.9 / rate.max()
    fa = RNG.random(g.n_cells)
    out = np.empty(g.n_cells)
    grad = twin_gradient(g, f, mom, dt, True)
    flux = twin_flux_pointwise(g, a, f, grad, clip=True)
    net = np.zeros(g.n_cells)
    np.add.at(net, g.owner, flux)
    np.add.at(net, g.neighbour, -flux)
    ref = 0.25 * fa + 0.75 * (f - dt * net / g.areas)
    _stage(g, fa, f, _side(g, mom), dt, 0.25, True, True, np.empty(g.cell_faces.size), out)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("nside", [1, 4, 16])
def test_stencil_classes(nside):
    """HEALPix cells that a rotation about the z axis maps onto each other share a class: the table has
    far fewer rows than cells, and every cell's row equals its own coefficients to 1e-12 relative (the
    coefficients' own rounding is ~1e-14 of them at these sizes)."""
    g = HealpixGrid(nside)
    cls, table = g.stencil_classes
    coef = g.stencil_coef_local
    assert np.abs(table[cls] - coef).max() <= 1e-12 * np.abs(coef).max()
    assert cls[0] == 0 and np.all(np.diff(np.maximum.accumulate(cls)) <= 1)  # numbered by first use
    if nside >= 4:
        assert len(table) < g.n_cells / 4
    # the frames are orthonormal and tangent at xbar
    B = g.tangent_basis
    n = g.xbar / np.linalg.norm(g.xbar, axis=1, keepdims=True)
    assert np.allclose(np.einsum("ntd,nsd->nts", B, B), np.eye(2), atol=1e-14)
    assert np.abs(np.einsum("ntd,nd->nt", B, n)).max() < 1e-14


def test_stage_update_compact_is_the_stage_update_bit_for_bit():
    """On an adaptive grid the stage kernel loops each cell over its own stencil and faces (Grid.kernel_split:
    most cells have 8 and 4 of the 12 and 8 slots) on compact rows (Grid.kernel_compact); the slots it leaves
    out are padding that adds exact zeros, so the stage equals the full loop's bit for bit, on both lists of
    cells, with and without alpha (an outflow array filled with NaN: a position it read but never wrote
    would show)."""
    g = _adaptive_grid()
    small, large = g.kernel_split
    assert len(small) > len(large) > 0 and len(small) + len(large) == g.n_cells
    assert np.array_equal(np.sort(np.concatenate([small, large])), np.arange(g.n_cells))
    model = ZeroTemperature(np.array([[1.0, 0.3, 0.0], [0.1, -1.0, 0.2], [0.0, 0.4, 0.8]]), np.eye(3))
    F, G, d = g.face_points.shape
    a = np.einsum("fgk,fgk->fg", model.velocity(g.face_points.reshape(-1, 3)).reshape(F, G, 3), g.face_normals)
    f = np.exp(RNG.normal(size=g.n_cells))
    f[::7] = 0.0  # cells at 0 (theta = 0) too
    side = _side(g, twin_moments(g, a))
    rate = np.empty(g.n_cells)
    fv.cell_rates(twin_moments(g, a), g.cell_faces, g.cell_face_sign, g.areas, rate, np.empty(g.n_cells))
    dt = 0.9 / rate.max()
    fa = RNG.random(g.n_cells)
    cls, coef = g.stencil_classes
    for alpha in (0.0, 0.25):
        ref = np.empty(g.n_cells)
        fv.stage_update(fa, f, g.stencil_offsets, cls, coef, side, g.inflow_offsets, g.kernel_areas, dt, alpha,
                        True, True, np.empty(g.cell_faces.size), ref)
        # the compact rows (what the solver runs on adaptive grids): the small cells read 8 stencil offsets
        # and 4 face slots from compact copies, the outflows are stored 4 a cell plus 4 per large cell
        stencil4, in4, in_large, n_out = g.kernel_compact
        side4 = np.empty((g.n_cells, 4, side.shape[2]))
        fv.compact_side(side, side4)
        assert np.array_equal(side4, side[:, :4])
        comp = np.empty(g.n_cells)
        fv.stage_update_compact(fa, f, stencil4, g.stencil_offsets, cls, coef, side4, side, in4, in_large,
                                g.kernel_areas, dt, alpha, small, large, np.full(n_out, np.nan), comp)
        assert np.array_equal(comp.view(np.int64), ref.view(np.int64))


@pytest.mark.parametrize("grid_kind", ["healpix", "adaptive"])
def test_face_side_moments_modes_matches_twin(grid_kind):
    """The separable-field kernel (issue #22: the moments of sum_k c_k A_k without forming the sum) against
    the NumPy twin of the moments of the formed sum, for coefficients of both signs. The modes are three
    smooth fields whose combinations change sign inside some faces, so the point-by-point branch and both
    whole-face branches run (asserted); a face given the whole-face branch while its sign changes would
    put a negative weight into an outflow sum: O(the face's flux), far above the 1e-13 (rounding: the twin
    sums in another order)."""
    g = HealpixGrid(8) if grid_kind == "healpix" else _adaptive_grid()
    F, G, d = g.face_points.shape
    pts = g.face_points.reshape(-1, 3)
    fields = [np.cross([0.0, 0.0, 1.0], pts), np.cross([1.0, 0.5, 0.0], pts),
              pts[:, [2]] * np.cross([0.0, 1.0, 0.0], pts)]
    A = np.stack([np.einsum("fgk,fgk->fg", v.reshape(F, G, 3), g.face_normals) for v in fields])
    W = fv.mode_face_tables(A, g.face_points, g.xbar, g.owner, g.neighbour, np.linalg.norm(g.face_normals, axis=2))
    for c in ([0.3, 0.7, 0.0], [1.0, -1.0, 0.5], [-0.2, 0.05, -2.0], [0.0, 0.0, 0.0]):
        c = np.array(c)
        a = np.einsum("k,kfg->fg", c, A)
        mom = np.empty((g.n_faces, fv.moment_width(3)))
        side = np.full(g.cell_faces.shape + (3,), np.nan)
        side[g.cell_face_sign == 0] = 0.0
        fv.face_side_moments_modes(A, W, c, g.face_points, g.xbar, g.tangent_basis, g.owner, g.neighbour,
                                   g.face_slots, mom, side)
        scale = max(np.abs(a).sum(axis=1).max(), 1e-300)
        assert np.abs(mom - twin_moments(g, a)).max() <= 1e-13 * scale
        ref = np.empty_like(side)
        fv.side_moments(mom, g.tangent_basis, g.cell_faces, g.cell_face_sign, ref)
        assert np.array_equal(side, ref)
        if c.any():
            mid = W[:, :, 7] @ c
            spread = np.abs(W[:, :, 8] @ c) + W[:, :, 9] @ np.abs(c)
            uniform = (mid - spread >= 0) | (mid + spread <= 0)
            changes = (a.min(axis=1) < 0) & (a.max(axis=1) > 0)
            assert changes.any() and not (uniform & changes).any()  # the bound: never a face that changes
            assert 0.9 < uniform.mean() < 1.0  # both branches run; the bound is tight (smooth fields)


def _limited_rates(g, f, axis, dt, scheme="linear"):
    """The limited stage's rate (f - stage) / dt under a rigid rotation about ``axis``, with the linear or
    the quadratic reconstruction."""
    from spherepde.grids.base import quadratic_pair_arrays, quadratic_width

    F, G, d = g.face_points.shape
    v = np.cross(axis, g.face_points.reshape(-1, 3)).reshape(F, G, 3)
    a = np.einsum("fgk,fgk->fg", v, g.face_normals)
    out, outflow = np.empty(g.n_cells), np.empty(g.cell_faces.size)
    if scheme == "linear":
        _stage(g, f, f, _side(g, twin_moments(g, a)), dt, 0.0, True, True, outflow, out)
    else:
        L, Q = quadratic_width(3)
        mom, side = np.empty((g.n_faces, fv.moment_width(3))), np.zeros(g.cell_faces.shape + (1 + L + Q,))
        fv.face_side_moments_quadratic(a, a, 0.0, g.face_points, g.xbar, g.tangent_basis, g.quadratic_coef[1],
                                       *quadratic_pair_arrays(3), g.owner, g.neighbour, g.face_slots, mom, side)
        cls, coef = g.quadratic_classes
        fv.stage_update_quadratic(f, f, g.stencil_offsets, cls, coef, side, g.inflow_offsets, g.kernel_areas, dt,
                                  0.0, True, outflow, out)
    return (f - out) / dt


@pytest.mark.parametrize("scheme", ["linear", "quadratic"])
def test_limited_rate_is_continuous_where_face_outflows_change_sign(scheme):
    """Regression: the positivity limiter's face bound theta <= q f / (-g . Q) does not vanish as a face's
    outflow q -> 0+, so switching it on at a threshold of q made the right-hand side jump wherever a
    Gauss point's velocity changed sign. The error control then stalled (adaptive Figure 4 runs at beta
    30: the embedded estimate 1.5-3 times the tolerance from dt 1e-2 to 1e-8, 30-45 % of attempts
    rejected). Now the bound fades in over q < FACE_RAMP q_tot. Rigid rotations about axis(s) =
    (cos s, sin s, 0.4) on a rough density (bounds active in many cells): at every s in [0, 0.3] where a
    Gauss point's normal velocity changes sign (a_g(s) = axis(s) . (X_g x W_g), roots in closed form) the
    rate's difference quotient over s -+ 1e-9 is at most 3 times the steepest one of a scan of spacing
    1e-3 (a Lipschitz rate: equal up to the kinks; a jump J gives J / 2e-9). Measured over 128 roots, linear
    scheme: 451 against 451 now, 6.5e7 against 778 before the fix; quadratic: 405 against 405 now, 1.3e7 against 1255 before."""
    g = HealpixGrid(4)
    rng = np.random.default_rng(7)
    f = np.exp(2.0 * rng.normal(size=g.n_cells))
    f[rng.random(g.n_cells) < 0.15] = 0.0
    dt = 1e-4  # far inside the CFL limit: the step-independent bounds decide theta

    def rate(x):
        return _limited_rates(g, f, np.array([np.cos(x), np.sin(x), 0.4]), dt, scheme)

    scan = np.linspace(0.0, 0.3, 301)
    r = np.array([rate(x) for x in scan])
    lipschitz = np.max(np.abs(np.diff(r, axis=0)).max(axis=1) / np.diff(scan))
    c = np.cross(g.face_points, g.face_normals).reshape(-1, 3)  # a_g = axis . c_g
    # c0 cos s + c1 sin s = -0.4 c2: s = phi +- acos(-0.4 c2 / rho), phi = atan2(c1, c0)
    rho, phi = np.hypot(c[:, 0], c[:, 1]), np.arctan2(c[:, 1], c[:, 0])
    ok = np.abs(0.4 * c[:, 2]) < rho
    roots = np.concatenate([phi[ok] + sgn * np.arccos(-0.4 * c[ok, 2] / rho[ok]) for sgn in (1, -1)])
    roots = np.mod(roots, 2 * np.pi)
    roots = np.unique(np.round(roots[roots < 0.3], 12))
    assert roots.size > 20
    d = 1e-9
    steepest = max(np.abs(rate(x + d) - rate(x - d)).max() / (2 * d) for x in roots)
    assert steepest <= 3.0 * lipschitz, (steepest, lipschitz)


@pytest.mark.parametrize("grid_kind", ["healpix", "adaptive"])
@pytest.mark.parametrize("courant", [0.3, 0.9, 3.0])
def test_unlimited_outflows_are_the_limited_ones_bit_for_bit(grid_kind, courant):
    """The stage kernel skips the positivity limiter where it would return theta = 1 (fv._unlimited_outflows:
    every face outflow of the unscaled reconstruction >= 0, the total-outflow cap not binding). Its outflows
    must be the limiter's to the bit, cell by cell, on a state where every branch is taken: cells at 0,
    jumps that make face outflows negative, and steps whose cap binds (Courant number 3). The reference runs
    the limiter in full (gradient, theta, outflows of the scaled gradient) with the kernel's own helpers."""
    from numba import njit, uint64

    @njit
    def full_limiter(fb, stencil, cls, coef, side, area, dt, S, K, out):
        for i in range(fb.shape[0]):
            fi = fb[i]
            capf = (1.0 - fv.OUTFLOW_MARGIN) * area[i] / dt
            g0, g1, g2 = fv._ls_gradient(i, fb, stencil, i, coef, cls[i], S, 2)
            theta = fv._positivity_theta(i, fi, g0, g1, g2, side, capf, K, 2)
            g0 *= theta
            g1 *= theta
            for k in range(K):
                out[uint64(i * K + k)] = max(side[i, k, 0] * fi + fv._side_dot(i, k, side, g0, g1, g2, 2), 0.0)

    g = HealpixGrid(8) if grid_kind == "healpix" else _adaptive_grid()
    model = ZeroTemperature(np.array([[1.0, 0.3, 0.0], [0.1, -1.0, 0.2], [0.0, 0.4, 0.8]]), np.eye(3))
    F, G, d = g.face_points.shape
    a = np.einsum("fgk,fgk->fg", model.velocity(g.face_points.reshape(-1, 3)).reshape(F, G, 3), g.face_normals)
    rng = np.random.default_rng(7)
    f = 1.0 + 0.1 * g.centers[:, 0]  # smooth (the fast path) ...
    f[rng.random(g.n_cells) < 0.05] = 0.0  # ... with empty cells (theta = 0)
    jump = rng.random(g.n_cells) < 0.05
    f[jump] *= 50.0  # and jumps (negative face outflows: theta < 1)
    mom = twin_moments(g, a)
    side = _side(g, mom)
    rate = np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, np.empty(g.n_cells))
    dt = courant / rate.max()
    cls, coef = g.stencil_classes
    S, K = g.stencil_offsets.shape[1], g.inflow_offsets.shape[1]
    ref = np.empty(g.n_cells * K)
    full_limiter(f, g.stencil_offsets, cls, coef, side, g.areas, dt, S, K, ref)
    outflow = np.full(g.n_cells * K, np.nan)
    fv.stage_update(f, f, g.stencil_offsets, cls, coef, side, g.inflow_offsets, g.kernel_areas, dt, 0.0, True, True,
                    outflow, np.empty(g.n_cells))
    assert np.array_equal(outflow.view(np.int64), ref.view(np.int64))
    # every branch was taken: theta = 1 by the fast path, and theta < 1 from face bounds or the cap
    gr = np.empty((g.n_cells, 3))
    fv.limited_gradient(f, g.stencil, cls, coef, g.tangent_basis, side, g.areas, dt, True, gr)
    free = np.empty((g.n_cells, 3))
    fv.limited_gradient(f, g.stencil, cls, coef, g.tangent_basis, side, g.areas, dt, False, free)
    theta_lt1 = np.linalg.norm(gr, axis=1) < np.linalg.norm(free, axis=1) * (1 - 1e-12)
    assert theta_lt1.sum() > 10 and (~theta_lt1 & (f > 0)).sum() > 10


def test_incidence_numba_equals_numpy_twin():
    """The Numba loop of incidence gives its NumPy twin's tables (faces, signs, counts) slot for slot, on
    grids whose face lists are in owner order (HEALPix, tensor) and on an adaptive patch (sub-faces)."""
    from spherepde.grids.base import _incidence_numpy, incidence
    for g in _inflow_grids():
        width = g.cell_faces.shape[1]
        for a, b in zip(incidence(g.owner, g.neighbour, g.n_cells, width),
                        _incidence_numpy(g.owner, g.neighbour, g.n_cells, width)):
            assert np.array_equal(a, b) and a.dtype == b.dtype
        # a face list out of owner order (reversed) too
        for a, b in zip(incidence(g.owner[::-1], g.neighbour[::-1], g.n_cells, width),
                        _incidence_numpy(g.owner[::-1], g.neighbour[::-1], g.n_cells, width)):
            assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="more than 1 faces"):
        incidence(np.array([0, 0]), np.array([1, 2]), 3, 1)


def test_take_rows_equals_numpy_take():
    """take_rows (the regrid's parallel gather of kept rows) gives np.take(src, idx, axis=0) bit for bit: rows
    of the shapes a regrid copies (face points (F, G, 3), stencil coefficients (N, W, 2), 1-d), float and
    integer, a permutation with repeats, an empty index, a non-contiguous source; and refuses an index out
    of range (NumPy's take would raise too; the kernel itself does not check)."""
    from spherepde.kernels.arrays import take_rows

    rng = np.random.default_rng(5)
    for shape, dtype in (((1000, 6, 3), float), ((777, 12, 2), float), ((500,), np.int64), ((300, 4), np.int32)):
        src = (rng.normal(size=shape) * 1e6).astype(dtype)
        idx = rng.integers(0, shape[0], 2 * shape[0])
        got = take_rows(src, idx)
        assert got.dtype == src.dtype and got.shape == (len(idx),) + shape[1:]
        assert np.array_equal(got, np.take(src, idx, axis=0))
        assert take_rows(src, idx[:0]).shape == (0,) + shape[1:]
    strided = rng.normal(size=(400, 6, 3))[::2]
    assert np.array_equal(take_rows(strided, np.arange(200)[::-1]), strided[::-1])
    with pytest.raises(IndexError, match="outside"):
        take_rows(np.zeros((5, 2)), np.array([0, 5]))
    with pytest.raises(IndexError, match="outside"):
        take_rows(np.zeros((5, 2)), np.array([-1]))
