"""Plotting: projections are right, every figure kind is written, GIF has frames, S^1 dispatch."""
from dataclasses import replace
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

    import matplotlib.pyplot as plt

    res = fake_result(grid)
    before = set(plt.get_fignums())
    written = plotting.make_figures(res, tmp_path, kinds=("maps", "diagnostics", "concentration", "particles",
                                                          "animation"))
    assert set(plt.get_fignums()) == before  # plain Figures, no pyplot (and no backend) involved
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


# --- figures that read (issue #20): backend, colour bars, log scale, markers, frame times, overlays ---
PAPER = SimpleNamespace(B=np.diag([-1.0, -1.0, 1.0]), V=np.diag([-1.0, 1.0, -2.0]))


def _labels(fig):
    return [a.get_xlabel() + a.get_ylabel() for a in fig.axes]


def _texts(fig):
    return [t.get_text().replace("$_", "").replace("$", "").strip() for a in fig.axes for t in a.texts]


def test_import_leaves_the_backend_alone():
    import os
    import subprocess
    import sys

    env = dict(os.environ, MPLBACKEND="svg")
    code = "import spherepde.plotting, matplotlib; print(matplotlib.get_backend())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().lower() == "svg"


def test_colour_bars_are_labelled(grid):
    for kind in ("mollweide", "orthographic"):
        fig = plotting.plot_maps(fake_result(grid), kind=kind)
        assert any("density f" in s and "per unit area" in s for s in _labels(fig)), kind
    ax = plotting.plot_mollweide(grid, np.ones(grid.n_cells))
    assert any("density f" in s for s in _labels(ax.figure))


def test_log_scale_for_a_concentrated_state(grid):
    from matplotlib.colors import LogNorm

    f = np.full(grid.n_cells, 1e-9)
    f[0] = 50.0
    f[1] = 0.0  # a zero: floored, not a masked 'bad' pixel
    ax = plotting.plot_mollweide(grid, f)
    norm = ax.collections[0].norm
    assert isinstance(norm, LogNorm)
    assert norm.vmin == pytest.approx(plotting.LOG_FLOOR * 50.0) and norm.vmax == pytest.approx(50.0)
    assert np.ma.count_masked(ax.collections[0].get_array()) == 0
    near_uniform = 1 + 0.1 * grid.centers[:, 0]
    assert not isinstance(plotting.plot_mollweide(grid, near_uniform).collections[0].norm, LogNorm)
    assert isinstance(plotting.color_norm(near_uniform, "log"), LogNorm)
    assert not isinstance(plotting.color_norm(f, "linear"), LogNorm)


def test_maps_mark_the_axes_and_the_eigenspaces(grid):
    res = fake_result(grid)
    texts = _texts(plotting.plot_maps(res, kind="mollweide"))
    for lab in ("+e1", "-e1", "+e2", "-e2", "+e3", "-e3"):
        assert lab in texts
    res = replace(res, model=PAPER)  # E = span(e1), F = span(e2), F_abs = span(e3)
    fig = plotting.plot_maps(res, kind="mollweide")
    ax = fig.axes[0]
    red = [ln for ln in ax.lines if ln.get_markeredgecolor() == "red"]
    assert len(red) == 1
    np.testing.assert_allclose(np.abs(red[0].get_xdata()), [0, np.pi], atol=1e-12)  # +-e1 (astro: -lon)
    orange = [ln for ln in ax.lines if ln.get_markeredgecolor() == "orange"][0]
    np.testing.assert_allclose(orange.get_xdata(), [-np.pi / 2, np.pi / 2], atol=1e-12)  # +e2 left of centre
    assert fig.legends and "E (top eigenspace" in fig.legends[0].texts[0].get_text()
    # a 2-d eigenspace is drawn as its great circle
    res = replace(res, model=SimpleNamespace(B=np.eye(3), V=np.diag([1.0, 1.0, -0.5])))
    ax = plotting.plot_maps(res, kind="mollweide").axes[0]
    circle = [ln for ln in ax.lines if ln.get_color() == "red" and len(ln.get_xdata()) > 100]
    y = np.asarray(circle[0].get_ydata(), dtype=float)
    assert np.nanmax(np.abs(y)) < 1e-12  # span(e1, e2): the equator,
    assert np.isnan(y).any()  # broken at the seam (no line drawn across the map)


def test_mollweide_follows_healpy_astro_orientation(grid):
    # longitude increases to the left: +e2 (longitude 90 deg) is left of the centre
    x, y = plotting.mollweide_xy(np.array([[0.0, 1, 0], [0, 0, 1], [0, 0, -1]]))
    np.testing.assert_allclose(x, [-np.pi / 2, 0, 0], atol=1e-15)
    _, _, img = plotting._mollweide_image(grid, grid.centers[:, 1], 72, 36)
    assert img[18, 18] > 0.9 and img[18, 54] < -0.9
    geo = plotting._mollweide_image(grid, grid.centers[:, 1], 72, 36, flip="geo")[2]
    assert geo[18, 18] < -0.9


def _dynamic_result(grid, n=41):
    """Concentration early (t < 3) in a run to t = 20, E-exit and E-to-F transition late."""
    t = np.linspace(0, 20, n)
    res = fake_result(grid, n=n)
    aE = np.where(t < 10, 1 - 0.67 * np.exp(-2 * t), 0.33 + 0.67 * np.exp(-2 * (t - 10)))
    aF = 1 - aE
    res = replace(res, times=t, density=np.outer(1 + 30 * (1 - np.exp(-t)), np.ones(grid.n_cells)))
    res.metadata["concentration"] = {"times": t, "w2_limit": np.exp(-t), "alignment_E": aE, "alignment_F": aF,
                                     "alignment_F_abs": 0 * t}
    return res


def test_map_times_come_from_the_dynamics(grid):
    res = _dynamic_result(grid)
    idx, labels = plotting.choose_frames(res)
    quartiles = [0, 13, 27, 40]  # the old fixed choice: t = 0, 6.5, 13.5, 20
    assert idx[0] == 0 and idx[-1] == 40 and idx != quartiles
    assert labels[0] == "start" and labels[-1] == "end"
    assert any("t_EF" in s for s in labels) and any("t_exit" in s for s in labels)
    assert sum(res.times[i] < 3 for i in idx) >= 2  # frames where the state changes (the early phase)
    titles = [a.get_title() for a in plotting.plot_maps(res).axes if a.get_title()]
    assert titles[0].startswith("t = 0") and titles[-1].startswith("t = 20") and "t = 6.5" not in titles
    still = _dynamic_result(grid)
    still.metadata.pop("concentration")
    still = replace(still, density=np.ones_like(still.density))
    assert plotting.choose_frames(still)[0] == quartiles  # nothing changes: evenly spaced in time


def test_token_overlay_draws_each_token_once_on_its_hemisphere(grid):
    from matplotlib.collections import PathCollection

    res = fake_result(grid, n=2)
    fig = plotting.plot_maps(res, kind="orthographic", particles=True, indices=[1])
    sizes = [c.get_sizes() for a in fig.axes for c in a.collections if isinstance(c, PathCollection)]
    assert len(sizes) == 2  # seen from +v and from -v
    assert sum(s.sum() for s in sizes) == pytest.approx(plotting.TOKEN_AREA * 20)  # none twice, none lost
    front = plotting.plot_maps(res, kind="orthographic", particles=True, indices=[1], hemispheres="front")
    x = res.metadata["particles"]["positions"][1]
    n_front = int(np.sum(x @ np.asarray(plotting.DEFAULT_VIEW) >= 0))
    got = sum(c.get_sizes().sum() for a in front.axes for c in a.collections if isinstance(c, PathCollection))
    assert got == pytest.approx(plotting.TOKEN_AREA * n_front) and 0 < n_front < 20


@pytest.mark.parametrize("particles", [False, True])
def test_animation_frames_share_one_colour_scale(grid, tmp_path, monkeypatch, particles):
    from matplotlib import animation

    res = fake_result(grid, n=3, particles=particles)
    res = replace(res, density=res.density * np.array([[1.0], [10.0], [100.0]]))
    clims = []

    def fake_save(self, filename, writer=None, dpi=None, **kw):  # run the frames, record the colour limits
        self._draw_was_started = True
        for k in range(3):
            self._func(k)
            clims.append({a.get_clim() for ax in self._fig.axes for a in list(ax.collections) + list(ax.images)
                          if a.get_array() is not None})

    monkeypatch.setattr(animation.Animation, "save", fake_save)
    plotting.animate(res, tmp_path / "a.gif", view=plotting.DEFAULT_VIEW if particles else "mollweide")
    assert len(clims) == 3 and all(len(c) == 1 for c in clims) and clims[0] == clims[1] == clims[2]
    lo, hi = next(iter(clims[0]))
    assert lo <= res.density.min() * 1.0001 and hi == pytest.approx(res.density.max())


def test_diagnostics_say_where_min_f_crosses_the_gronwall_bound(grid):
    # the default positivity limiter lets min f fall below the continuum's Gronwall bound
    # (validation/min_density); the figure must say so where it happens, not leave a crossing unexplained
    res = fake_result(grid, n=5, particles=False)
    d = dict(res.diagnostics)
    d["gronwall"] = np.full(5, 0.1)
    d["min"] = np.array([0.1, 0.1, 0.05, 0.01, 0.001])  # below the bound from t = 0.5
    fig = plotting.plot_diagnostics(replace(res, diagnostics=d))
    ax = fig.axes[1]
    assert "min f < bound from t = 0.5" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "limiter 'positivity' does not keep it" in ax.get_title()
    d["min"] = np.full(5, 0.1 * (1 - 1e-4))  # within GRONWALL_TOL: the time integrator's share, no note
    ax = plotting.plot_diagnostics(replace(res, diagnostics=d)).axes[1]
    assert ax.get_title() == "density extremes" and len(ax.get_legend().get_texts()) == 3
