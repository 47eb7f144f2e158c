"""The log-quadratic scheme (``Options(scheme="log-quadratic")``, issues #16 and #22): a quadratic
reconstruction of log f, positive by construction. Its stage kernel against a NumPy twin, free streams
across refinement boundaries, third order on smooth densities, positivity and mass with zeros, and narrow
bumps kept where the limited polynomial schemes smear them."""
import numpy as np
import pytest

import spherepde as sp
from spherepde.grids.adaptive import AdaptiveHealpixGrid
from spherepde.kernels import fv
from test_quadratic import check_bell_positivity_and_mass  # the cosine bell rotated once: f >= 0, exact mass


def _cap(c, cos):
    c = np.asarray(c, float) / np.linalg.norm(c)
    return lambda g: g.centers @ c > cos


GRIDS = {
    "healpix": lambda: sp.HealpixGrid(8),
    "adaptive": lambda: AdaptiveHealpixGrid(4, 16, refinement=False).refined_where(
        lambda g: _cap([0.2, 0.1, 1.0], 0.8)(g) | _cap([1.0, 0.0, 0.05], 0.93)(g)),
}


def _twin_stage(g, f, a, dt):
    """One forward-Euler stage of the log-quadratic scheme in plain NumPy, written from the definition: per
    cell a weighted least-squares quadratic (weights 1 / |xbar_k - xbar_i|^2, the grid's) of log f_k - log f_i
    in the tangent frame, normalised by the cell rule; upwind Gauss-point fluxes; each cell's outflows scaled
    down to min(8 q_tot, |C| / dt) f_i (LOG_OUTFLOW_RATIO q_tot, the content over the stage)."""
    N = g.n_cells
    y = np.log(np.maximum(f, 1e-300))

    def mono(u):
        return np.stack([u[..., 0], u[..., 1], u[..., 0] ** 2, u[..., 0] * u[..., 1], u[..., 1] ** 2], -1)

    r = np.zeros((N, 5))
    for i in range(N):
        nb = np.unique(g.stencil[i][g.stencil[i] != i])
        D = g.xbar[nb] - g.xbar[i]
        A = mono(D @ g.tangent_basis[i].T)
        sw = 1.0 / np.linalg.norm(D, axis=1)
        r[i] = np.linalg.lstsq(A * sw[:, None], (y[nb] - y[i]) * sw, rcond=None)[0]
    B = g.tangent_basis
    Lq = np.einsum("nqr,nr->nq", mono(np.einsum("ntk,nqk->nqt", B, g.cell_points - g.xbar[:, None])), r)
    top = Lq.max(1)
    mean = np.exp(Lq - top[:, None]) @ g.cell_weights

    def value(cells):  # the reconstruction of each face's cell at the face's Gauss points
        u = np.einsum("ftk,fgk->fgt", B[cells], g.face_points - g.xbar[cells][:, None])
        L = np.einsum("fgr,fr->fg", mono(u), r[cells]) - top[cells][:, None]
        return f[cells][:, None] * np.exp(np.minimum(L, 700.0)) / mean[cells][:, None]

    out_o = (np.maximum(a, 0) * value(g.owner)).sum(1)
    out_n = -(np.minimum(a, 0) * value(g.neighbour)).sum(1)
    tot, qtot = np.zeros(N), np.zeros(N)
    np.add.at(tot, g.owner, out_o)
    np.add.at(tot, g.neighbour, out_n)
    np.add.at(qtot, g.owner, np.maximum(a, 0).sum(1))
    np.add.at(qtot, g.neighbour, -np.minimum(a, 0).sum(1))
    cap = np.minimum((1 - 1e-12) * g.areas / dt, 8.0 * qtot) * f
    s = np.where(tot > cap, cap / np.where(tot > 0, tot, 1.0), 1.0)
    flux = out_o * s[g.owner] - out_n * s[g.neighbour]
    div = np.zeros(N)
    np.add.at(div, g.owner, flux)
    np.add.at(div, g.neighbour, -flux)
    return f - dt * div / g.areas


def _kernel_stage(g, f, a, dt):
    mom = np.empty((g.n_faces, fv.moment_width(g.dim)))
    wside = np.zeros(g.cell_faces.shape + (g.face_points.shape[1],))
    fv.face_side_weights(a, a, 0.0, g.face_points, g.xbar, g.owner, g.neighbour, g.face_slots, mom, wside)
    y = np.empty(g.n_cells)
    fv.log_values(f, y)
    cls, coef = g.log_quadratic_classes
    out = np.empty(g.n_cells)
    fv.stage_update_log(f, f, y, g.stencil_offsets, cls, coef, g.cell_points, g.cell_weights, wside, g.cell_faces,
                        g.face_points, g.xbar, g.tangent_basis, g.inflow_offsets, g.kernel_areas, dt, 0.0, True,
                        np.empty(g.cell_faces.size), out)
    return out


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_stage_kernel_against_its_numpy_twin(name):
    """A stage on a rough positive density with exact zeros and a narrow bump, under a rotation plus a
    contraction (so outflows reach the caps), at a small step and at a step where the content cap binds:
    the Numba kernel and the twin agree to 1e-12 of max f. The difference is rounding: the exponentials
    and sums in another order, and the class table's coefficients (equal to the per-cell ones to 1e-12
    relative, ``stencil_classes``) multiplying log-differences up to ~700. Measured 8e-16 and 3e-14 of max
    f; the stage changes f by 1 % and 50-70 % of max f. A twin with the outflow ratio 4 instead of 8 fails."""
    g = GRIDS[name]()
    rng = np.random.default_rng(5)
    c = np.array([0.3, 0.5, 0.8]) / np.linalg.norm([0.3, 0.5, 0.8])
    f = np.exp(40.0 * (g.xbar @ c - 1.0)) * (1 + 0.3 * rng.random(g.n_cells)) + 0.2 * rng.random(g.n_cells)
    f[rng.random(g.n_cells) < 0.2] = 0.0
    v = np.cross([0.2, -0.4, 1.0], g.face_points) + 2.0 * (c - np.einsum("fgk,k->fg", g.face_points, c)[..., None]
                                                           * g.face_points)
    a = np.einsum("fgk,fgk->fg", v, g.face_normals)
    rate = max(np.bincount(g.owner, np.maximum(a, 0).sum(1), g.n_cells).max(), 1e-300) / g.areas.min()
    for dt in (0.05 / rate, 2.0 / rate):
        k, t = _kernel_stage(g, f, a, dt), _twin_stage(g, f, a, dt)
        assert np.abs(k - t).max() <= 1e-12 * f.max(), (dt, np.abs(k - t).max())
        assert k.min() >= 0.0
        assert abs(np.dot(k - f, g.areas)) <= 1e-14 * np.dot(f, g.areas) * 10  # flux form: a few ulps


def test_free_stream_across_refinement_boundaries():
    """A constant density in rigid rotation stays constant (the issue's free-stream bar, 1e-9) on the mixed
    adaptive grid: log f is constant, so the fit is 0 and every face value is the cell mean. Measured 5e-12."""
    g = GRIDS["adaptive"]()
    r = sp.solve(g, sp.Prescribed.rigid_rotation([0.3, -0.5, 1.0]), lambda x: np.ones(len(x)), 1.0,
                 scheme="log-quadratic")
    assert np.abs(r.density[-1] - 1.0).max() <= 1e-9


def _rotation_l1(g, prof, axis, T):
    from scipy.spatial.transform import Rotation

    rot = Rotation.from_rotvec(np.asarray(axis, float) / np.linalg.norm(axis) * T)
    r = sp.solve(g, sp.Prescribed.rigid_rotation(axis), prof, T, scheme="log-quadratic")
    ex = g.cell_average(lambda x: prof(rot.inv().apply(x)))
    return np.sum(np.abs(r.density[-1] - ex) * g.areas) / np.sum(ex * g.areas)


def test_third_order_on_a_smooth_density_that_is_not_exponential():
    """A smooth positive density that is no exponential of a quadratic, rotated once nearly over the poles:
    L1 3.54e-3, 4.74e-4 at nside 16, 32 (order 2.90), as the quadratic scheme (3.65e-3, 4.83e-4). Bar: the
    issue's third order, 2.7."""
    def prof(x):
        return 1.2 + np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.5 * x[:, 2] ** 2

    axis = [np.cos(0.05), 0.0, np.sin(0.05)]
    e = [_rotation_l1(sp.HealpixGrid(n), prof, axis, 2 * np.pi) for n in (16, 32)]
    assert np.log2(e[0] / e[1]) > 2.7, e


def test_third_order_across_a_refined_patch_and_the_bump_nearly_exact():
    """The quadratic scheme's refined-patch test (tests/test_quadratic.py): a bump exp(-8 (1 - x . c)) over
    the south pole through a static patch one order finer, half a turn. log f of a vMF bump is linear in x,
    nearly a quadratic in the tangent frame, so the error is ~7 times the quadratic scheme's: measured L1
    7.34e-3, 9.87e-4 (order 2.89; quadratic 0.0472, 0.00676). Bars: order 2.7, and below a third of the
    quadratic scheme's measured error at nside 16."""
    c0 = np.array([1.0, 0.0, 0.0])
    grids = [AdaptiveHealpixGrid(n, 2 * n, refinement=False).refined_where(_cap([-0.6, 0.0, -0.8], 0.5))
             for n in (8, 16)]
    e = [_rotation_l1(g, lambda x: np.exp(-8.0 * (1 - x @ c0)), [0.0, 1.0, 0.0], np.pi) for g in grids]
    assert np.log2(e[0] / e[1]) > 2.7, e
    assert e[1] < 0.00676 / 3, e


def test_positivity_and_mass_with_zeros():
    """A compactly supported cosine bell (zero on most of the sphere: log f at the floor log 1e-300 there)
    rotated once on HEALPix and on the mixed adaptive grid: every cell >= 0, mass to round-off (a few ulps
    a step, summed): tests/test_quadratic.py's check."""
    check_bell_positivity_and_mass("log-quadratic", (sp.HealpixGrid(16), GRIDS["adaptive"]()))


def test_a_narrow_bump_keeps_its_place():
    """The bump proxy of validation/adaptive_clusters at nside 32: a vMF bump 1.5 cells wide (w = 0.048)
    carried one radian by a rigid rotation. The limited linear scheme moves its centroid ahead by a
    fraction of a cell; the log reconstruction holds the bump's position. Measured centroid errors 4.98e-3
    (linear) and 7.1e-4 (log-quadratic). Bar: a third of the linear scheme's error."""
    c0 = np.array([1.0, 0.2, 0.3]) / np.linalg.norm([1.0, 0.2, 0.3])
    axis = np.array([0.0, 0.3, 1.0]) / np.linalg.norm([0.0, 0.3, 1.0])
    from scipy.spatial.transform import Rotation

    cT = Rotation.from_rotvec(axis).apply(c0)
    g = sp.HealpixGrid(32)
    f0 = g.cell_average(lambda x: np.exp((x @ c0 - 1.0) / 0.048 ** 2))
    errs = {}
    for scheme in ("linear", "log-quadratic"):
        r = sp.solve(g, sp.Prescribed.rigid_rotation(axis), f0, 1.0, scheme=scheme)
        m = r.density[-1] * g.areas
        cen = (m[:, None] * g.xbar).sum(0)
        errs[scheme] = float(np.arccos(np.clip(cen @ cT / np.linalg.norm(cen), -1, 1)))
    assert errs["log-quadratic"] < errs["linear"] / 3, errs


def test_options_config_and_errors():
    """The Barth-Jespersen limiter is refused with the scheme, by name; a grid that is not S^2, or has no
    fixed cell quadrature (the tensor grids), is refused by name; configs take ``scheme.scheme = "log-quadratic"``."""
    with pytest.raises(ValueError, match="limiter='maximum'.*log-quadratic"):
        sp.Options(scheme="log-quadratic", limiter="maximum")
    with pytest.raises(ValueError, match="log-quadratic.*S\\^2 grid.*TensorGrid of dim 2"):
        sp.solve(sp.TensorGrid(2, 16), sp.Prescribed.linear(np.array([[0.0, -1.0], [1.0, 0.0]])),
                 lambda x: np.ones(len(x)), 0.1, scheme="log-quadratic")
    with pytest.raises(ValueError, match="cell quadrature.*TensorGrid of dim 3"):
        sp.solve(sp.TensorGrid(3, 8), sp.Prescribed.rigid_rotation([0.0, 0.0, 1.0]), lambda x: np.ones(len(x)),
                 0.1, scheme="log-quadratic")
    from spherepde.config import SchemeConfig

    assert SchemeConfig.parse({"scheme": "log-quadratic"}).options().scheme == "log-quadratic"
