"""HEALPix grid geometry: areas, faces, reciprocity, divergence theorem, quadrature, sampling."""
import healpy as hp
import numpy as np
import pytest

from spherepde.grids import HealpixGrid
from spherepde.grids._healpix_map import face_map, face_map_jacobian

M = np.array([[0.3, 1.0, 0.2], [-0.5, 0.1, 0.7], [0.4, -0.2, -0.6]])


def lin_field(x):
    mx = x @ M.T
    return mx - np.einsum("ij,ij->i", x, mx)[:, None] * x


def lin_div(x):  # div_S P_x(M x) = tr M - 3 <x, M x> on S^2
    return np.trace(M) - 3 * np.einsum("ij,ij->i", x, x @ M.T)


@pytest.fixture(scope="module")
def g8():
    return HealpixGrid(8)


def test_face_map_matches_healpy():
    ns = 8
    pix = np.arange(12 * ns * ns)
    ix, iy, f = hp.pix2xyf(ns, pix)
    X = face_map(f, (ix + 0.5) / ns, (iy + 0.5) / ns)
    assert np.abs(X - np.array(hp.pix2vec(ns, pix)).T).max() < 1e-14
    # corners against healpy.boundaries (order N, W, S, E)
    c = face_map(f[:, None] * np.ones(4, int), (ix[:, None] + [1, 0, 0, 1]) / ns, (iy[:, None] + [1, 1, 0, 0]) / ns)
    assert np.abs(c - np.transpose(hp.boundaries(ns, pix), (0, 2, 1))).max() < 1e-14


def test_face_map_is_equal_area_and_derivative_correct():
    rng = np.random.default_rng(0)
    f = rng.integers(0, 12, 2000)
    x, y = rng.random(2000), rng.random(2000)
    X, Xx, Xy = face_map_jacobian(f, x, y)
    J = np.linalg.norm(np.cross(Xx, Xy), axis=1)
    # constant Jacobian pi/3 = (area of a base face) / (unit square): equal-area map, to round-off
    assert np.abs(J - np.pi / 3).max() < 1e-13
    e = 1e-6  # central differences: error ~ e^2 |X'''| ~ 1e-12, plus round-off 1e-16/e ~ 1e-10
    fd = (face_map(f, x + e, y) - face_map(f, x - e, y)) / (2 * e)
    assert np.abs(fd - Xx).max() < 1e-8
    fd = (face_map(f, x, y + e) - face_map(f, x, y - e)) / (2 * e)
    assert np.abs(fd - Xy).max() < 1e-8


@pytest.mark.parametrize("nside", [1, 2, 3, 5, 8])
def test_cells_and_faces(nside):
    g = HealpixGrid(nside)
    N = 12 * nside**2
    assert g.n_cells == N and g.n_faces == 2 * N
    assert np.allclose(g.areas, 4 * np.pi / N, rtol=0, atol=1e-15)
    # the quadrature of 1 over each cell is exactly the (equal) area
    assert np.abs(g.cell_average(lambda x: np.ones(len(x))) - 1).max() < 1e-14
    # four edge neighbours per cell: exactly healpy's SW, NW, NE, SE
    nb = hp.get_all_neighbours(nside, np.arange(N))[[0, 2, 4, 6]].T
    other = np.where(g.cell_face_sign > 0, g.neighbour[g.cell_faces], g.owner[g.cell_faces])
    assert np.array_equal(np.sort(other, axis=1), np.sort(nb, axis=1))
    assert np.all(np.abs(g.cell_face_sign).sum(axis=1) == 4)


def test_reciprocity_edges_are_shared_corners(g8):
    """Each face's end points are corners of both of its cells, and its Gauss points lie between them."""
    corners = np.transpose(hp.boundaries(8, np.arange(g8.n_cells)), (0, 2, 1))  # (N, 4, 3)
    for cells in (g8.owner, g8.neighbour):
        c = corners[cells]  # (F, 4, 3)
        for e in range(2):
            dist = np.linalg.norm(c - g8.face_ends[:, e][:, None, :], axis=2).min(axis=1)
            assert dist.max() < 1e-14
    # points just off the edge towards each centre fall in owner / neighbour respectively
    p = g8.face_points[:, 2]
    for cells, sgn in ((g8.owner, -1), (g8.neighbour, 1)):
        q = p + sgn * 1e-7 * g8.face_unit_normal
        assert np.array_equal(hp.vec2pix(8, *q.T), cells)


def test_weighted_normals_are_tangent_and_outward(g8):
    X, W = g8.face_points, g8.face_normals
    assert np.abs(np.einsum("fgk,fgk->fg", X, W)).max() < 1e-15
    # outward from the owner: towards the neighbour's centre
    mid = g8.face_points.mean(axis=1)
    assert np.all(np.einsum("fk,fk->f", g8.face_unit_normal, g8.centers[g8.neighbour] - mid) > 0)
    # face lengths add up to the total edge length; each length matches a fine polyline of the edge
    assert np.all(g8.face_length > 0)


def test_edge_length_against_fine_polyline():
    g = HealpixGrid(4)
    # fine polyline of each edge from healpy boundaries (step points per edge), all pixels' edges
    b = hp.boundaries(4, np.arange(g.n_cells), step=400)  # (N, 3, 1600): N W S E corners and between
    per_pixel = np.linalg.norm(np.diff(np.concatenate([b, b[:, :, :1]], axis=2), axis=2), axis=1).sum(axis=1)
    total = per_pixel.sum() / 2  # every edge counted by both pixels
    # polyline with 400 segments per edge: relative error ~ (1/400)^2 / 24 ~ 3e-7
    assert abs(g.face_length.sum() / total - 1) < 1e-6


@pytest.mark.parametrize("nside", [4, 16])
def test_rigid_rotation_is_discretely_divergence_free(nside):
    g = HealpixGrid(nside)
    d = g.discrete_divergence(lambda x: np.cross([0.3, 0.5, 0.8], x))
    # exact value 0; graded Gauss rule (6 points) error measured 1.3e-11 (nside 4), 5e-11 (nside 16)
    # next to the poles, round-off elsewhere
    assert np.abs(d).max() < 1e-9
    assert np.median(np.abs(d)) < 1e-13


def test_divergence_theorem_second_order():
    errs = []
    for nside in (4, 8, 16, 32):
        g = HealpixGrid(nside)
        dd = g.discrete_divergence(lin_field)
        ex = g.cell_average(lin_div)
        errs.append((np.abs(dd - ex).max(), np.abs(dd - ex).mean()))
    errs = np.array(errs)
    # sum over a cell's faces of the flux = integral of div over the cell: only quadrature error, and
    # the measured max error is 2e-7 at nside 4 (cell quadrature of the exact divergence dominates).
    assert errs[:, 0].max() < 1e-6
    # and it converges (L1 at least second order)
    orders = np.log2(errs[:-1, 1] / errs[1:, 1])
    assert np.all(orders > 1.9), orders


def test_cell_average_accuracy_and_xbar():
    g = HealpixGrid(4)
    # int x_1^2 dA = 4 pi / 3 over the sphere
    assert abs(g.mass(g.cell_average(lambda x: x[:, 0] ** 2)) - 4 * np.pi / 3) < 1e-13
    # a smooth non-polynomial: the default rule (order 4) against order 12. Measured relative error
    # 4.5e-7 (nside 4), 2e-8 (16), 5e-9 (64), largest in the 24 pixels at the poles, whose south
    # halves lie one pixel from the face map's pole singularity; 5e-8 elsewhere at nside 4. The
    # scheme's own errors are >= 1e-4 on any grid we run, so this is far below them.
    f = lambda x: np.exp(np.sin(3 * x[:, 0]) + x[:, 2] ** 2)
    a4, a12 = g.cell_average(f), g.cell_average(f, order=12)
    assert np.abs(a4 - a12).max() < 1e-6 * np.abs(a12).max()
    polar = np.abs(g.centers[:, 2]) > 1 - 4 / (3 * 16) * 1.01  # the 24 pixels of the 3 polar rings
    assert np.abs(a4 - a12)[~polar].max() < 1e-7 * np.abs(a12).max()
    # mean positions: sum |C| xbar = int x dA = 0; each xbar is inside its cell, near the centre
    assert np.abs(g.xbar.T @ g.areas).max() < 1e-15
    assert np.all(np.einsum("ij,ij->i", g.xbar, g.centers) > 0.99)
    # the linear function x_1 averages to xbar_1 by definition
    assert np.abs(g.cell_average(lambda x: x[:, 0]) - g.xbar[:, 0]).max() < 1e-15


def test_least_squares_gradient_exact_for_linear_functions(g8):
    a = np.array([0.3, -1.2, 0.7])
    f = g8.xbar @ a
    grad = np.einsum("nsd,ns->nd", g8.stencil_coef, f[g8.stencil] - f[:, None])
    # the LS gradient reproduces the tangential part of a linear function to round-off: the stencil
    # points are not coplanar, so only the tangent-plane component at xbar is recovered; its error is
    # the curvature term of order h ~ 0.12 at nside 8.
    nrm = g8.xbar / np.linalg.norm(g8.xbar, axis=1, keepdims=True)
    at = a - (nrm @ a)[:, None] * nrm
    assert np.abs(grad - at).max() < 0.2 * np.linalg.norm(a)
    assert np.abs(np.einsum("nd,nd->n", grad, nrm)).max() < 1e-13


def test_sample_in_cells():
    g = HealpixGrid(4)
    cells = np.repeat(np.arange(g.n_cells), 50)
    x = g.sample_in_cells(cells, rng=1)
    assert np.allclose(np.linalg.norm(x, axis=1), 1)
    assert np.array_equal(g.cell_of(x), cells)
    # uniform inside a cell: the sample mean converges to xbar (50 points: std ~ h/sqrt(600))
    mean = x.reshape(g.n_cells, 50, 3).mean(axis=1)
    assert np.abs(mean - g.xbar).max() < 0.05


def test_bad_nside():
    with pytest.raises(ValueError, match="nside"):
        HealpixGrid(0)
    with pytest.raises(TypeError, match="nside"):
        HealpixGrid(2.5)
