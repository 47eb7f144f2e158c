"""Results files: round trip, incremental writing, checkpoints, FITS."""
import h5py
import numpy as np
import pytest

from spherepde import io
from spherepde.config import parse_config
from spherepde.solver import Solver, solve

TOML = """
name = "io"
[grid]
type = "healpix"
nside = 2
[model]
type = "zero_temperature"
B = "paper"
V = "paper"
[initial]
type = "vmf_mixture"
means = [[1, 0, 0]]
kappas = 2.0
uniform_weight = 0.3
[time]
t_end = 0.5
save_every = 0.25
"""


@pytest.fixture(scope="module")
def run():
    cfg = parse_config(TOML)
    grid, model = cfg.build_grid(), cfg.build_model()
    res = solve(grid, model, cfg.build_initial(grid), cfg.time.t_end, save_at=cfg.save_times(),
                options=cfg.options())
    return cfg, res


def test_round_trip_equals(run, tmp_path):
    cfg, res = run
    p = io.save_result(res, tmp_path / "r.h5", config=cfg)
    back = io.load(p)
    np.testing.assert_array_equal(back.times, res.times)
    np.testing.assert_array_equal(back.density, res.density)
    assert set(back.diagnostics) == set(res.diagnostics)
    for k in res.diagnostics:
        np.testing.assert_array_equal(back.diagnostics[k], res.diagnostics[k])
    assert back.options == res.options
    assert back.n_steps == res.n_steps and back.wall_time == res.wall_time
    assert back.grid.nside == 2 and back.grid.n_cells == res.grid.n_cells
    np.testing.assert_array_equal(back.grid.centers, res.grid.centers)
    np.testing.assert_array_equal(back.model.B, res.model.B)
    np.testing.assert_array_equal(back.model.V, res.model.V)
    assert back.metadata["config"] == cfg
    assert back.metadata["complete"] is True
    assert back.metadata["versions"]["numpy"] == np.__version__


def test_file_is_self_describing(run, tmp_path):
    cfg, res = run
    p = io.save_result(res, tmp_path / "r.h5", config=cfg)
    with h5py.File(p, "r") as h:
        assert h.attrs["format"] == io.FORMAT
        assert h["config"].attrs["toml"] == cfg.text
        assert '"nside": 2' in h["config"].attrs["json"]
        assert h["grid"].attrs["type"] == "healpix" and h["grid"].attrs["order"] == "RING"
        assert h["grid/centers"].shape == (48, 3)
        for pkg in ("spherepde", "numpy", "scipy", "numba", "healpy", "h5py"):
            assert pkg in h["versions"].attrs


def test_load_without_config_rebuilds_healpix_grid(run, tmp_path):
    _, res = run
    back = io.load(io.save_result(res, tmp_path / "r.h5"))
    assert back.grid.nside == 2 and back.model is None and back.metadata["config"] is None
    np.testing.assert_array_equal(back.density, res.density)


def test_incremental_writer_survives_a_crash(run, tmp_path):
    """Frames are on disk after each append: a writer that never finishes still gives them back."""
    cfg, res = run
    p = tmp_path / "partial.h5"
    w = io.ResultsWriter(p, cfg, res.grid, res.options)
    w.append(res.times[0], res.density[0])
    w.append(res.times[1], res.density[1])
    # a second reader sees both frames while the writer is still open (flushed)
    back = io.load(p)
    assert back.metadata["complete"] is False
    np.testing.assert_array_equal(back.density, res.density[:2])
    w.close()
    # resuming keeps only the checkpoint's frame count
    w = io.ResultsWriter(p, cfg, res.grid, res.options, resume=1)
    assert w.n_saved == 1
    w.append(res.times[1], res.density[1])
    w.append(res.times[2], res.density[2])
    w.finish(res.diagnostics, res.n_steps, 0.0)
    w.close()
    back = io.load(p)
    np.testing.assert_array_equal(back.density, res.density)
    assert back.metadata["complete"] is True


def test_not_a_results_file(tmp_path):
    p = tmp_path / "x.h5"
    with h5py.File(p, "w") as h:
        h.attrs["format"] = "other"
    with pytest.raises(ValueError, match="not a spherepde results file"):
        io.load(p)


def test_checkpoint_round_trip_is_exact(run, tmp_path):
    cfg, res = run
    s = Solver(res.grid, res.model, cfg.build_initial(res.grid), res.options)
    for _ in range(3):
        s.step()
    st = s.get_state()
    p = tmp_path / "ck.h5"
    io.write_checkpoint(p, st, {"n_saved": 2, "config_json": cfg.to_json()})
    assert not (tmp_path / "ck.h5.tmp").exists()
    back, extra = io.read_checkpoint(p)
    assert extra["n_saved"] == 2 and extra["config_json"] == cfg.to_json()
    assert back["t"] == st["t"] and back["n_steps"] == st["n_steps"] and back["l0"] == st["l0"]
    np.testing.assert_array_equal(back["f"], st["f"])
    assert back["diag"] == st["diag"]  # exact float lists
    # continuing from the restored state reproduces the original continuation bit for bit
    s2 = Solver(res.grid, res.model, cfg.build_initial(res.grid), res.options)
    s2.set_state(back)
    for _ in range(3):
        s.step()
        s2.step()
    assert s.t == s2.t
    np.testing.assert_array_equal(s.f, s2.f)


def test_write_fits_ring_order(run, tmp_path):
    import healpy as hp

    _, res = run
    p = io.write_fits(res, tmp_path / "m.fits", index=-1)
    m, header = hp.read_map(p, nest=None, h=True, dtype=np.float64)
    header = dict(header)
    assert header["ORDERING"] == "RING" and header["NSIDE"] == 2
    assert header["TIME"] == pytest.approx(res.times[-1])
    np.testing.assert_array_equal(m, res.density[-1])


def test_versions_lists_dependencies():
    v = io.versions()
    for k in ("python", "spherepde", "numpy", "numba", "healpy", "h5py", "matplotlib"):
        assert k in v
