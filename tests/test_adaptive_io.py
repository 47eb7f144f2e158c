"""Adaptive grids at the front door (issue #16 item 6): configs with ``grid.type = "adaptive"``, results
files that store each saved state's cells (NUNIQ) and read back with xarray, netCDF4 and spherepde's
``load``, checkpoints and resume, multi-order FITS maps (read by mhealpy) and the mesh-level figure."""
import shutil

import h5py
import numpy as np
import pytest

import spherepde as sp
from spherepde import io
from spherepde.config import ConfigError, parse_config
from spherepde.grids.adaptive import AdaptiveHealpixGrid, Refinement
from spherepde.runner import run_experiment

CONFIG = """
name = "adaptive io"
[grid]
type = "adaptive"
nside_min = 4
nside_max = 32
[model]
type = "attention"
B = "paper"
V = "paper"
beta = 2.0
[initial]
type = "vmf_mixture"
means = [[1, 0, 0], [0, 0.6, 0.8]]
kappas = [150, 80]
uniform_weight = 0.05
[time]
t_end = 0.6
save_every = 0.2
[output]
plots = []
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted run of CONFIG through the runner (about 6 s; 125 steps, 2880-6768 cells)."""
    out = tmp_path_factory.mktemp("adaptive_run")
    return run_experiment(parse_config(CONFIG), out, figures=False), out


def _cfg(**grid):
    text = CONFIG
    for k, v in grid.items():
        text = text.replace("nside_max = 32", f"nside_max = 32\n{k} = {v}")
    return parse_config(text)


def test_config_builds_the_adaptive_grid_and_names_bad_keys():
    cfg = _cfg(max_cells=40000, variation=0.3, buffer=1, regrid_interval=2)
    g = cfg.build_grid()
    assert isinstance(g, AdaptiveHealpixGrid) and (g.nside_min, g.nside_max, g.max_cells) == (4, 32, 40000)
    assert g.refinement == Refinement(variation=0.3, buffer=1, interval=2) and g.regrid_interval == 2
    assert cfg.build_grid().refinement.attention == Refinement().attention  # the rest: the defaults
    assert _cfg(refine="false").build_grid().refinement is False
    assert _cfg(attended="true").build_grid().refinement == Refinement(attended=True)
    assert not cfg.build_grid().refinement.attended  # off unless asked for
    assert (_cfg(attended="true", attended_floor=1e-8).build_grid().refinement
            == Refinement(attended=True, attended_floor=1e-8))
    assert _cfg(attention_variation=0.1).build_grid().refinement == Refinement(attention_variation=0.1)
    f0 = cfg.build_initial(g)  # the density function, on which the solver refines before the run
    assert callable(f0) and [w for _, w in f0.features] == pytest.approx([150 ** -0.5, 80 ** -0.5])
    assert parse_config(cfg.text).to_json() == cfg.to_json()  # the TOML it writes reads back the same
    for text, key in ((CONFIG.replace("nside_max = 32", "nside_max = 24"), "grid.nside_max"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 2"), "grid.nside_max"),
                      (CONFIG.replace("nside_min = 4", ""), "grid.nside_min"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\nnside = 8"), "grid.nside"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\ncoarsen = 1.0"), "grid.coarsen"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\nmax_cells = 10"), "grid.max_cells"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\nattended = 1"), "grid.attended"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\nattended_floor = -1e-8"),
                       "grid.attended_floor"),
                      (CONFIG.replace("nside_max = 32", "nside_max = 32\nattention_variation = -0.1"),
                       "grid.attention_variation"),
                      (CONFIG.replace("uniform_weight = 0.05", 'uniform_weight = 0.05\nsample = "center"'),
                       "initial.sample")):
        with pytest.raises(ConfigError) as e:
            parse_config(text)
        assert e.value.key == key


def test_max_cells_is_an_error_naming_it(tmp_path):
    cfg = _cfg(max_cells=1000)
    with pytest.raises(ValueError, match="max_cells"):
        run_experiment(cfg, tmp_path / "out", figures=False)


def test_a_completed_adaptive_run_is_loaded_not_rerun(finished):
    """run_experiment on the directory of a finished adaptive run loads it: the results file is not
    rewritten, and the frames (of different lengths) are the run's. Bug found 2026-12-03: the frames'
    check made one NumPy array of the ragged frames, which NumPy refuses, so every finished adaptive
    run was judged damaged and recomputed from scratch (an adaptive_clusters member: 10-25 minutes)."""
    res, out = finished
    mtime = (out / "results.h5").stat().st_mtime_ns
    again = run_experiment(parse_config(CONFIG), out, figures=False)
    assert (out / "results.h5").stat().st_mtime_ns == mtime
    assert len(again.density) == len(res.density)
    assert all(np.array_equal(a, b) for a, b in zip(again.density, res.density))
    assert len({len(d) for d in again.density}) > 1  # the frames are ragged (the case the bug was in)


def test_load_builds_each_states_grid_on_demand(finished):
    """load() builds no saved state's grid but the first (a large adaptive file: minutes of grids otherwise):
    ``grids`` is a StateGrids whose grids appear when asked for, in any order, with the same arrays bit for
    bit as the run's own (built from scratch by solve's regrids), the same object for equal cell sets, and
    ``areas_at(i)`` from the cells alone equal to the grid's areas bit for bit (a sweep's mass per frame)."""
    from spherepde.io import StateGrids

    _, out = finished
    res = sp.load(out / "results.h5")
    g = res.grids
    assert isinstance(g, StateGrids) and len(g) == 4 and sorted(g._built) == [0]
    areas = [res.areas_at(i) for i in range(4)]
    assert sorted(g._built) == [0]  # the areas did not build a grid
    ref = sp.load(out / "results.h5")
    for i in (3, 1, 2):  # out of order: each from the nearest built below it
        a, b = g[i], ref.grids[i]
        for name in ("uniq", "centers", "areas", "xbar", "face_points", "face_normals", "owner", "neighbour",
                     "stencil", "stencil_coef"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (i, name)
        assert np.array_equal(areas[i], a.areas)
    assert g[-1] is g[3] and g[1:3] == [g[1], g[2]]
    with pytest.raises(IndexError, match="saved state 4"):
        g[4]
    twice = StateGrids(res.grid, [g[1].uniq, g[1].uniq, g[2].uniq])
    assert twice[0] is twice[1] and twice[1] is not twice[2] and not twice.one_cell_set


def test_results_file_holds_each_states_cells(finished):
    """Every saved state's NUNIQ and densities come back from load() as they were computed (the run's own
    grids rebuilt from them: same cells, centres and areas bit for bit), and from the file itself as CF
    ragged arrays through xarray and netCDF4 (no spherepde), with each state's mass 1."""
    res, out = finished
    path = out / "results.h5"
    assert isinstance(res.density, list) and len(res.grids) == 4
    sizes = [res.grid_at(i).n_cells for i in range(4)]
    assert len(set(sizes)) > 1  # the grid changed between saved states
    # an independent solve of the same configuration: the same cells and densities per state
    cfg = parse_config(CONFIG)
    grid, model, f0 = cfg.build_all()
    ref = sp.solve(grid, model, f0, cfg.time.t_end, save_at=cfg.save_times(), options=cfg.options())
    for i in range(4):
        a, b = ref.grid_at(i), res.grid_at(i)
        assert np.array_equal(a.uniq, b.uniq) and np.array_equal(res.density[i], ref.density[i])
        assert np.array_equal(a.centers, b.centers) and np.array_equal(a.areas, b.areas)
        assert np.array_equal(a.stencil, b.stencil)
        assert abs(b.mass(res.density[i]) - 1.0) < 1e-12
    import netCDF4
    import xarray as xr

    with xr.open_dataset(path) as ds:
        counts = ds["cell_count"].values
        assert ds["cell_count"].attrs["sample_dimension"] == "cell"
        assert list(counts) == sizes and ds.sizes["cell"] == sum(sizes)
        stop = np.cumsum(counts)
        for i, (a, b) in enumerate(zip(stop - counts, stop)):
            dens, area = ds["density"].values[a:b], ds["cell_area"].values[a:b]
            assert abs(float(dens @ area) - 1.0) < 1e-12
            assert np.array_equal(ds["uniq"].values[a:b], res.grid_at(i).uniq)
        assert ds["density"].attrs["units"] == "sr-1" and "NUNIQ" in ds["uniq"].attrs["long_name"]
    with netCDF4.Dataset(path) as nc:
        assert nc.dimensions["cell"].size == sum(sizes) and list(nc["cell_count"][:]) == sizes
    # without a configuration the grids are rebuilt from the file's grid attributes
    bare = io.load(path, rebuild=False)
    assert bare.grid is None and [len(u) for u in bare.metadata["uniq"]] == sizes


def test_a_damaged_cell_index_fails_its_checksum(finished, tmp_path):
    res, out = finished
    path = tmp_path / "r.h5"
    shutil.copy(out / "results.h5", path)
    with h5py.File(path, "a") as h:
        h["uniq"][5] = h["uniq"][5] + 1  # another pixel: the frame's checksum covers its cells
    with pytest.raises(io.DamagedFileError, match="frame 0"):
        io.load(path)
    with h5py.File(path, "a") as h:
        h["uniq"][5] = h["uniq"][5] - 1
        h["cell_count"][1] = h["cell_count"][1] + 1  # states that no longer tile the cell dimension
    with pytest.raises(io.DamagedFileError, match="cell_count"):
        io.load(path)


def test_resume_after_a_kill_is_bit_for_bit(finished, tmp_path):
    """Stopped half way (as if killed, after a checkpoint whose grid differs from the initial one), the
    rerun resumes from the checkpoint's cells: the same cells, densities and diagnostics as the
    uninterrupted run, bit for bit."""
    res, _ = finished
    out = tmp_path / "run"
    cfg = parse_config(CONFIG)
    assert run_experiment(cfg, out, figures=False, stop_after_steps=res.n_steps // 2) is None
    state, _ = io.read_checkpoint(out / "checkpoint.h5")
    assert state["n_regrids"] > 0 and not np.array_equal(state["grid"]["uniq"], res.grid_at(0).uniq)
    again = run_experiment(cfg, out, figures=False)
    assert again.n_steps == res.n_steps
    for i in range(len(res.times)):
        assert np.array_equal(again.grid_at(i).uniq, res.grid_at(i).uniq)
        assert np.array_equal(again.density[i], res.density[i])
    for k in res.diagnostics:
        assert np.array_equal(again.diagnostics[k], res.diagnostics[k]), k


def test_checkpoint_carries_the_cells(tmp_path):
    g = AdaptiveHealpixGrid(4, 16)
    s = sp.Solver(g, sp.Prescribed.rigid_rotation([1.0, 0.0, 0.0]), lambda x: np.exp(40 * (x[:, 2] - 1)))
    s.advance(0.3)
    io.write_checkpoint(tmp_path / "c.h5", s.get_state(), {"n": 1})
    state, _ = io.read_checkpoint(tmp_path / "c.h5")
    assert np.array_equal(state["grid"]["uniq"], s.grid.uniq) and state["n_regrids"] == s.n_regrids
    with h5py.File(tmp_path / "c.h5", "a") as h:
        h["grid"]["uniq"][0] += 4  # another cell set, the same density: the checksum tells
    with pytest.raises(io.DamagedFileError, match="checksum"):
        io.read_checkpoint(tmp_path / "c.h5")


def test_multiorder_fits_read_by_mhealpy(finished, tmp_path):
    """write_fits of an adaptive state is a multi-order map (ORDERING = NUNIQ) that mhealpy reads as one:
    the same cells and values, the same mass from mhealpy's own pixel areas, and the value of the cell at
    any point."""
    import mhealpy

    res, _ = finished
    g = res.grid_at(2)
    io.write_fits(res, tmp_path / "m.fits", 2)
    m = mhealpy.HealpixMap.read_map(str(tmp_path / "m.fits"))
    assert m.is_moc and np.array_equal(m.uniq, g.uniq) and np.array_equal(m.data, res.density[2])
    area = np.asarray(getattr(m.pixarea(), "value", m.pixarea()), float)
    assert abs(float(m.data @ area) - 1.0) < 1e-12
    pts = np.random.default_rng(0).normal(size=(50, 3))
    pts /= np.linalg.norm(pts, axis=1)[:, None]
    theta, phi = np.arccos(pts[:, 2]), np.arctan2(pts[:, 1], pts[:, 0])
    vals = m[m.ang2pix(theta, phi)]
    assert np.array_equal(getattr(vals, "value", vals), res.density[2][g.cell_of(pts)])


def test_mesh_levels_figure_and_postprocess(finished, tmp_path):
    from spherepde import plotting
    from spherepde.runner import postprocess

    res, run_dir = finished
    fig = plotting.plot_mesh(res, indices=[0, 3])
    assert len(fig.axes) == 3  # two maps and the colour bar of the levels
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == ["4", "8", "16", "32"]
    with pytest.raises(ValueError, match="adaptive HEALPix grid"):
        plotting.plot_mesh(sp.solve(sp.HealpixGrid(4), sp.Prescribed.rigid_rotation([0, 0, 1.0]),
                                       lambda x: 1 + 0 * x[:, 0], 0.1))
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    cfg = parse_config(CONFIG.replace("plots = []", 'plots = ["maps"]\nfits = true'))
    postprocess(io.load(out / "results.h5"), cfg, out)
    names = sorted(p.name for p in (out / "figures").iterdir())
    assert "mesh_levels.png" in names and "maps_mollweide.png" in names
    assert len(list((out / "fits").glob("density_*.fits"))) == 4
    conc = io.load(out / "results.h5").metadata["concentration"]  # per state, each on its own cells
    assert conc["w2_limit"].shape == (4,) and np.all(np.isfinite(conc["w2_limit"]))
    for i in range(4):  # E = span(e1) for the paper's matrices: alignment = int x_1^2 f, on state i's cells
        g = res.grid_at(i)
        assert abs(conc["alignment_E"][i] - float(res.density[i] * g.areas @ g.centers[:, 0] ** 2)) < 1e-12


def test_cli_plot_and_fits_of_an_adaptive_run(finished, tmp_path):
    """``spherepde plot DIR --kinds maps --fits`` on an adaptive run: the maps, the mesh levels and one
    multi-order FITS map per saved state, each holding that state's cells."""
    from astropy.io import fits

    from spherepde.cli import main

    res, run_dir = finished
    out = tmp_path / "figs"
    assert main(["-q", "plot", str(run_dir), "--kinds", "maps", "--fits", "-o", str(out)]) == 0
    assert {"maps_mollweide.png", "maps_orthographic.png", "mesh_levels.png"} <= {p.name for p in out.iterdir()}
    for i in range(len(res.times)):
        with fits.open(out / "fits" / f"density_{i:04d}.fits") as hdul:
            assert hdul[1].header["ORDERING"] == "NUNIQ"
            assert np.array_equal(hdul[1].data["UNIQ"], res.grid_at(i).uniq)
            assert hdul[1].header["TIME"] == res.times[i]


def test_sweep_record_of_an_adaptive_member(finished):
    """A sweep member on an adaptive grid: its per-frame record is taken on each frame's own cells (the
    mass of each is 1, the cell count is the frame's), where the uniform-grid code took one array."""
    from spherepde.sweeps import member_record

    res, _ = finished
    rec = member_record(res, parse_config(CONFIG))
    assert rec["frames"]["n_cells"] == [float(res.grid_at(i).n_cells) for i in range(len(res.times))]
    assert np.allclose(rec["frames"]["mass"], 1.0, rtol=0, atol=1e-12)
    assert rec["frames"]["max_density"] == [float(np.max(f)) for f in res.density]


def test_field_history_survives_a_checkpoint_across_regrids(tmp_path):
    """field_interval on a grid that regrids: the checkpoint holds the history's means (which the next
    regrid moves), so a run resumed from the file is the uninterrupted run, bit for bit, through the
    regrids that follow; a checkpoint without the means (an older version's) resumes too and drops the
    history at the next regrid (evaluating the field more often). Nside 4..16: the regrids of nside 4..32 at
    a fraction of the cost, regridding every CFL step (the error control's steps are a fraction of one)."""
    from spherepde.config import MATRIX_PRESETS
    from spherepde.grids.adaptive import Refinement

    P = MATRIX_PRESETS["paper"]
    model = sp.Attention(P["B"], P["V"], 10.0)
    c = np.array([0.6, 0.0, 0.8])
    f0 = lambda x: 1e-3 + np.exp(20 * (x @ c - 1))  # noqa: E731
    opts = sp.Options(field_interval=4)
    ref = sp.Solver(AdaptiveHealpixGrid(4, 16, refinement=Refinement(interval=1)), model, f0, opts)
    ref.advance(0.3)
    assert ref._history and all(ms is not None for _, _, ms in ref._history)
    io.write_checkpoint(tmp_path / "c.h5", ref.get_state(), {"n": 1})
    n0 = ref.n_regrids
    ref.advance(0.6)
    assert ref.n_regrids > n0 + 3
    state, _ = io.read_checkpoint(tmp_path / "c.h5")
    assert state["history_means"] and all(len(ms) == 1 for ms in state["history_means"])
    other = sp.Solver(AdaptiveHealpixGrid(4, 16, refinement=Refinement(interval=1)), model, f0, opts)
    other.set_state(state)
    other.advance(0.6)
    assert other.n_steps == ref.n_steps and np.array_equal(other.grid.uniq, ref.grid.uniq)
    assert np.array_equal(other.f, ref.f)
    state.pop("history_means")
    old = sp.Solver(AdaptiveHealpixGrid(4, 16, refinement=Refinement(interval=1)), model, f0, opts)
    old.set_state(state)
    old.advance(0.6)
    assert abs(old.grid.mass(old.f) - ref.grid.mass(ref.f)) < 1e-14


def test_a_run_continues_to_a_later_t_end_on_a_changing_grid(finished, tmp_path, request):
    """CONFIG run to t = 0.4, then asked for t_end = 0.6: it continues from the final checkpoint's cells,
    and the frames, cells and diagnostics are the uninterrupted run's, bit for bit (the ragged results file
    keeps the first three states and appends the rest)."""
    res, _ = finished
    out = tmp_path / "run"
    short = run_experiment(parse_config(CONFIG.replace("t_end = 0.6", "t_end = 0.4")), out, figures=False)
    assert len(short.times) == 3
    taken = request.getfixturevalue("steps_taken")  # counted from here
    again = run_experiment(parse_config(CONFIG), out, figures=False)
    assert len(taken) == res.n_steps - short.n_steps > 0  # continued from the checkpoint, not recomputed
    assert again.n_steps == res.n_steps and np.array_equal(again.times, res.times)
    for i in range(len(res.times)):
        assert np.array_equal(again.grid_at(i).uniq, res.grid_at(i).uniq)
        assert np.array_equal(again.density[i], res.density[i])
    for k in res.diagnostics:
        assert np.array_equal(again.diagnostics[k], res.diagnostics[k]), k
