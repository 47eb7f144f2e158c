"""Results files: round trip, incremental writing, checkpoints, FITS."""
import json

import h5py
import numpy as np
import pytest

from spherepde import io
from spherepde.config import parse_config
from spherepde.solver import Solver, solve
from toml_configs import zero_temperature_run

TOML = zero_temperature_run("io", means="[[1, 0, 0]]", uniform_weight=0.3)


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
        assert h["cell_center"].shape == (48, 3) and h["cell_area"].shape == (48,)
        np.testing.assert_array_equal(h["cell_center"][()], res.grid.centers)
        assert h.attrs["Conventions"] == "CF-1.10" and h.attrs["config_toml"] == cfg.text
        assert "ducc0" in json.loads(h.attrs["versions"])
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


def _flip_bit(value: float, bit: int = 3) -> float:
    """The float with one low mantissa bit flipped: plausible (finite, >= 0, same mass to 1e-15)."""
    return float(np.frombuffer((np.float64(value).view(np.uint64) ^ np.uint64(1 << bit)).tobytes(), np.float64)[0])


@pytest.mark.parametrize("where", ["frame", "time", "diagnostics", "config"])
def test_a_flipped_bit_in_a_results_file_is_an_error_naming_it(run, tmp_path, where):
    """Issue #21 item 2 (checksums): a flipped bit in results.h5 was returned by ``load`` as if right. Every
    frame, group and the configuration carry a SHA-256 checksum; a flip is a DamagedFileError naming it."""
    cfg, res = run
    p = io.save_result(res, tmp_path / "r.h5", config=cfg)
    io.load(p)  # intact: verifies
    with h5py.File(p, "a") as h:
        if where == "frame":
            h["density"][1, 7] = _flip_bit(h["density"][1, 7])
        elif where == "time":
            h["time"][1] = _flip_bit(h["time"][1], 0)
        elif where == "diagnostics":
            d = h["diagnostics"]["mass"][()]
            d[-1] = _flip_bit(d[-1], 0)
            h["diagnostics"]["mass"][...] = d
        else:
            h["config"].attrs["toml"] = h["config"].attrs["toml"].replace("kappas = 2.0", "kappas = 2.5")
    match = {"frame": "frame 1", "time": "frame 1", "diagnostics": "/diagnostics", "config": "configuration"}
    with pytest.raises(io.DamagedFileError, match=match[where]):
        io.load(p)
    io.load(p, verify=False)  # readable on request (the user asked for the raw content)


def test_a_flipped_bit_in_a_checkpoint_is_an_error(run, tmp_path):
    cfg, res = run
    s = Solver(res.grid, res.model, cfg.build_initial(res.grid), res.options)
    s.step()
    p = tmp_path / "ck.h5"
    io.write_checkpoint(p, s.get_state(), {"n_saved": 1, "config_json": cfg.to_json()})
    io.read_checkpoint(p)
    with h5py.File(p, "a") as h:
        h["f"][5] = _flip_bit(h["f"][5])
    with pytest.raises(io.DamagedFileError, match="checksum"):
        io.read_checkpoint(p)


def test_a_crafted_results_file_cannot_exhaust_memory_on_load(run, tmp_path):
    """Issue #21 item 9: a results file whose density dataset claims 10^8 frames (600 GB; chunked, so the
    file stays small) is refused before anything is read; so is a density of the wrong cell count."""
    cfg, res = run
    p = io.save_result(res, tmp_path / "r.h5", config=cfg)
    n = res.grid.n_cells
    with h5py.File(p, "a") as h:
        del h["density"], h["time"]
        h.create_dataset("density", shape=(10**8, n), dtype="f8", chunks=(1, n))
        h.create_dataset("time", shape=(10**8,), dtype="f8", chunks=(1024,))
    assert p.stat().st_size < 10**6
    with pytest.raises(io.DamagedFileError, match="GiB"):
        io.load(p)
    with h5py.File(p, "a") as h:
        del h["density"], h["time"]
        h.create_dataset("density", data=np.zeros((2, n + 1)))
        h.create_dataset("time", data=np.zeros(2))
    with pytest.raises(io.DamagedFileError, match="shape"):
        io.load(p)


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
