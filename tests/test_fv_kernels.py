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
        for k in range(fc.shape[1]):
            if gq[i, k] < 0 and q[i, k] * f[i] + gq[i, k] < 0:
                theta[i] = min(theta[i], (1 - fv.OUTFLOW_MARGIN) * q[i, k] * f[i] / -gq[i, k])
        cap = (1 - fv.OUTFLOW_MARGIN) * f[i] * g.areas[i] / dt
        s0, s1 = q[i].sum() * f[i], gq[i].sum()  # the kernel reads q, Q from side_moments
        if s1 > 0 and s0 + theta[i] * s1 > cap:
            theta[i] = min(theta[i], max(cap - s0, 0) / s1)
    return grad * theta[:, None]


def twin_flux_pointwise(g, a, f, grad):
    """Upwind flux from the reconstruction evaluated at each Gauss point (no moments)."""
    ro = f[g.owner][:, None] + np.einsum("fgk,fk->fg", g.face_points - g.xbar[g.owner][:, None], grad[g.owner])
    rn = f[g.neighbour][:, None] + np.einsum("fgk,fk->fg", g.face_points - g.xbar[g.neighbour][:, None],
                                              grad[g.neighbour])
    return np.sum(np.where(a > 0, a * ro, a * rn), axis=1)


def _face_side(g, a, a_prev, c):
    mom = np.empty((g.n_faces, fv.moment_width(g.dim)))
    side = np.full(g.cell_faces.shape + (g.dim + 1,), np.nan)
    side[g.cell_face_sign == 0] = 0.0  # the caller's part: padding slots
    fv.face_side_moments(a, a_prev, c, g.face_points, g.xbar, g.owner, g.neighbour, g.face_slots, mom, side)
    return mom, side


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
    side = np.empty((g.n_cells, 4, 4))
    fv.side_moments(mom, g.cell_faces, g.cell_face_sign, side)
    fv.limited_gradient(f, g.stencil, g.stencil_coef, side, g.areas, dt, limit, out)
    ref = twin_gradient(g, f, mom, dt, limit)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-14)
    if limit:  # the limiter did something (else this test could not fail on it)
        assert np.any(np.abs(ref - twin_gradient(g, f, mom, dt, False)) > 1e-6)


def test_face_flux_matches_pointwise_upwind(setup):
    g, a, f = setup
    mom = twin_moments(g, a)
    grad = RNG.normal(size=(g.n_cells, 3))
    flux = np.empty(g.n_faces)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux)
    assert np.allclose(flux, twin_flux_pointwise(g, a, f, grad), rtol=1e-12, atol=1e-14)


def test_cell_update_and_rates(setup):
    g, a, f = setup
    mom = twin_moments(g, a)
    flux = RNG.normal(size=g.n_faces)
    fb = RNG.random(g.n_cells)
    out = np.empty(g.n_cells)
    fv.cell_update(f, fb, flux, g.cell_faces, g.cell_face_sign, g.areas, 0.01, 0.25, out)
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


def test_positivity_of_one_limited_euler_stage(setup):
    """The limiter's promise: one forward-Euler stage at outflow Courant number 1 keeps f >= 0."""
    g, a, f = setup
    mom = twin_moments(g, a)
    rate = np.empty(g.n_cells)
    div = np.empty(g.n_cells)
    fv.cell_rates(mom, g.cell_faces, g.cell_face_sign, g.areas, rate, div)
    dt = 1.0 / rate.max()
    grad = np.empty((g.n_cells, 3))
    side = np.empty((g.n_cells, 4, 4))
    fv.side_moments(mom, g.cell_faces, g.cell_face_sign, side)
    fv.limited_gradient(f, g.stencil, g.stencil_coef, side, g.areas, dt, True, grad)
    flux = np.empty(g.n_faces)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux)
    out = np.empty(g.n_cells)
    fv.cell_update(f, f, flux, g.cell_faces, g.cell_face_sign, g.areas, dt, 0.0, out)
    assert out.min() >= 0.0
    # without the limiter the same stage goes negative (so the test above can fail)
    fv.limited_gradient(f, g.stencil, g.stencil_coef, side, g.areas, dt, False, grad)
    fv.face_flux(f, grad, g.owner, g.neighbour, mom, flux)
    fv.cell_update(f, f, flux, g.cell_faces, g.cell_face_sign, g.areas, dt, 0.0, out)
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
    side = np.empty((g.n_cells, 4, 4))
    fv.side_moments(mom, g.cell_faces, g.cell_face_sign, side)
    fa = RNG.random(g.n_cells)
    out = np.empty(g.n_cells)
    outflow = np.empty(g.cell_faces.size)
    fv.stage_update(fa, f, g.stencil, g.stencil_coef, side, g.cell_inflow, g.areas, dt, 0.25, linear, limit,
                    outflow, out)
    grad = twin_gradient(g, f, mom, dt, limit) if linear else np.zeros((g.n_cells, 3))
    flux = twin_flux_pointwise(g, a, f, grad)
    net = np.zeros(g.n_cells)
    np.add.at(net, g.owner, flux)
    np.add.at(net, g.neighbour, -flux)
    ref = 0.25 * fa + 0.75 * (f - dt * net / g.areas)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-13)
    # conservation: the outflow slots and the inflow gather cancel in the total
    assert abs(np.sum((out - 0.25 * fa) * g.areas) - 0.75 * np.sum(f * g.areas)) < 1e-13
    if limit:  # one forward-Euler stage at this dt keeps f >= 0 with the limiter, not without
        fv.stage_update(f, f, g.stencil, g.stencil_coef, side, g.cell_inflow, g.areas, dt, 0.0, True, True,
                        outflow, out)
        assert out.min() >= 0.0
        fv.stage_update(f, f, g.stencil, g.stencil_coef, side, g.cell_inflow, g.areas, dt, 0.0, True, False,
                        outflow, out)
        assert out.min() < 0.0


def test_cell_inflow_is_an_involution():
    """Slot k of cell i and its inflow slot name the same face from both sides."""
    from spherepde.grids import TensorGrid

    for g in (HealpixGrid(1), HealpixGrid(3), TensorGrid(3, 6), TensorGrid(2, 5)):
        flat = g.cell_inflow.ravel()
        real = g.cell_face_sign.ravel() != 0
        K = g.cell_faces.shape[1]
        assert np.array_equal(flat[flat][real], np.arange(flat.size)[real])
        assert np.array_equal(g.cell_faces.ravel()[flat][real], g.cell_faces.ravel()[real])
        assert np.array_equal(g.cell_face_sign.ravel()[flat][real], -g.cell_face_sign.ravel()[real])
        assert np.array_equal(flat[~real], np.arange(flat.size)[~real])
        assert np.all(flat[real] // K != np.arange(flat.size)[real] // K)


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
        fv.side_moments(mom, grid.cell_faces, grid.cell_face_sign, ref)
        assert np.array_equal(side, ref)
    assert mom.shape[1] == 2 + 2 * d
    if not isinstance(grid, HealpixGrid) and grid.dim > 2:
        assert (grid.cell_face_sign == 0).any()  # the case covers padding slots
