"""Plotting: projections are right, every figure kind is written, GIF has frames, S^1 dispatch."""
from types import SimpleNamespace

import numpy as np
import pytest

from spherepde import plotting
from spherepde.grids.healpix import HealpixGrid
from spherepde.solver import Options, Result


@pytest.fixture(scope="module")
def grid():
    return HealpixGrid(4)


def fake_result(grid, n=3, particles=True, dim_override=None):
    rng = np.random.default_rng(0)
    dens = rng.random((n, grid.n_cells)) + 0.1
    t = np.linspace(0, 1, n)
    diag = {"time": t, "mass": np.ones(n), "min": dens.min(1), "max": dens.max(1), "sup_div": np.ones(n),
            "gronwall": np.exp(-t) * 0.1, "dt": np.full(n, 0.5)}
    meta = {"concentration": {"times": t, "w2_limit": np.exp(-t), "alignment_E": t / 2, "alignment_F": 1 - t / 2,
                              "alignment_F_abs": 0 * t, "particles_w2_limit": np.exp(-t),
                              "particles_alignment_E": t / 2, "particles_alignment_F": t / 3}}
    if particles:
        x = rng.normal(size=(n, 20, 3))
        meta["particles"] = {"times": t, "positions": x / np.linalg.norm(x, axis=2, keepdims=True),
                             "weights": np.full(20, 0.05)}
    return Result(times=t, density=dens, diagnostics=diag, grid=grid, model=None, options=Options(), n_steps=n - 1,
                  metadata=meta)


def test_orthographic_projection():
    pts = np.array([[1.0, 0, 0], [-1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    u, v, front = plotting.orthographic_project(pts, view=(1, 0, 0))
    np.testing.assert_allclose([u[0], v[0]], [0, 0], atol=1e-15)
    assert front[0] and not front[1]
    # the north pole is at the top of the disk, +y to the right of a view from +x
    np.testing.assert_allclose([u[3], v[3]], [0, 1], atol=1e-15)
    np.testing.assert_allclose([u[2], v[2]], [1, 0], atol=1e-15)
    np.testing.assert_allclose(u**2 + v**2, [0, 0, 1, 1], atol=1e-15)


def test_sample_map_healpix_and_kdtree_agree_at_centres(grid):
    f = np.arange(grid.n_cells, dtype=float)
    np.testing.assert_array_equal(plotting.sample_map(grid, f, grid.centers), f)
    other = SimpleNamespace(dim=3, centers=grid.centers)  # a non-HEALPix grid: nearest centre
    np.testing.assert_array_equal(plotting.sample_map(other, f, grid.centers * 1.0), f)


def test_mollweide_image_orientation(grid):
    # f = x-coordinate of the centre: the map is largest at longitude 0 (image centre), smallest at +-180
    f = grid.centers[:, 0]
    lon, lat, img = plotting._mollweide_image(grid, f, 72, 36)
    assert img[18, 36] > 0.9 and img[18, 0] < -0.9 and abs(img[0, 36]) < 0.2


def test_make_figures_writes_every_kind(grid, tmp_path):
    from PIL import Image

    res = fake_result(grid)
    written = plotting.make_figures(res, tmp_path, kinds=("maps", "diagnostics", "concentration", "particles",
                                                          "animation"))
    names = {p.name for p in written}
    assert names == {"maps_mollweide.png", "maps_orthographic.png", "diagnostics.png", "concentration.png",
                     "particles_overlay.png", "density.gif"}
    for p in written:
        assert p.stat().st_size > 1000
    with Image.open(tmp_path / "density.gif") as im:
        assert im.n_frames == 3


def test_circle_line_plot_dispatch(tmp_path):
    th = np.linspace(-np.pi, np.pi, 64, endpoint=False) + np.pi / 64
    circle = SimpleNamespace(dim=2, centers=np.stack([np.cos(th), np.sin(th)], 1), n_cells=64)
    f = 1 + np.cos(th)
    ax = plotting.plot_density(circle, f)
    x, y = ax.lines[0].get_data()
    assert np.all(np.diff(x) > 0)
    np.testing.assert_allclose(y, 1 + np.cos(x))
    res = fake_result(circle, particles=False)
    written = plotting.make_figures(res, tmp_path, kinds=("maps", "animation"))
    assert {p.name for p in written} == {"maps_circle.png", "density.gif"}


def test_maps_need_the_right_dimension():
    g4 = SimpleNamespace(dim=4, centers=np.eye(4))
    with pytest.raises(ValueError, match="dim 4"):
        plotting.plot_density(g4, np.ones(4))
    with pytest.raises(ValueError, match="S\\^2"):
        plotting.plot_mollweide(g4, np.ones(4))
