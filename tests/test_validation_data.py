"""The validation studies' raw data files are NetCDF4/CF that describe themselves (issue #20 item 7):
every file opens with xarray alone, every variable has a long_name and units, the time axis is a
coordinate, and no study writes .npz any more."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "validation"
# the committed data (sweep_runs/ and quick-mode outputs are rebuilt by rerunning and not committed)
FILES = sorted(p for p in VALIDATION.glob("**/*.nc")
               if "sweep_runs" not in p.parts and "quick" not in p.parts and "_quick" not in p.name)


def test_no_npz_left_in_the_studies():
    # the studies' writers moved to validation.datafile; an .npz here is data no CF reader describes
    assert not sorted(str(p.relative_to(ROOT)) for p in VALIDATION.glob("**/*.npz"))
    sources = [p for p in VALIDATION.glob("**/*.py") if "np.savez" in p.read_text()]
    assert not sources, sources


def test_the_committed_data_is_there():
    # corollary2_rate (3), fig3_density (1), min_density (10), pde_vs_particles (7)
    by_study = {}
    for p in FILES:
        by_study.setdefault(p.relative_to(VALIDATION).parts[0], []).append(p)
    counts = {k: len(v) for k, v in by_study.items()}
    assert counts.get("corollary2_rate") == 3 and counts.get("fig3_density") == 1
    assert counts.get("min_density") == 10 and counts.get("pde_vs_particles") == 7


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(VALIDATION)) for p in FILES])
def test_each_file_opens_with_xarray_and_describes_every_variable(path):
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        assert ds.attrs["Conventions"] == "CF-1.8" and ds.attrs["title"]
        assert "version_spherepde" in ds.attrs and "version_ducc0" in ds.attrs
        for name, var in ds.variables.items():
            if name in ds.dims and name not in ds.coords:
                continue
            assert var.attrs.get("long_name"), (path.name, name)
            assert "units" in var.attrs, (path.name, name)
        if "time" in ds.dims and any(len(v.dims) > 1 for v in ds.data_vars.values()):
            assert "time" in ds.coords and np.all(np.diff(ds["time"].values) > 0)
        for name, var in ds.data_vars.items():
            if var.dtype.kind == "f":
                assert np.all(np.isfinite(var.values)), (path.name, name)


def test_netcdf4_reads_the_same_numbers():
    # a second, independent reader (netCDF-C) sees the same arrays as xarray/h5netcdf
    netCDF4 = pytest.importorskip("netCDF4")
    import xarray as xr

    path = VALIDATION / "corollary2_rate" / "raw_nside32.nc"
    with netCDF4.Dataset(path) as nc, xr.open_dataset(path, engine="h5netcdf") as ds:
        assert nc.variables["w2"].dimensions == ("time",)
        assert np.array_equal(nc.variables["w2"][:].data, ds["w2"].values)
        assert np.array_equal(nc.variables["time"][:].data, ds["time"].values)
        assert nc.variables["vp"].dimensions == ("p", "time")


def test_save_load_round_trip_and_undescribed_variables(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT))
    from validation import datafile

    schema = {"times": (("time",), "time", "1"), "w2": (("time",), "W2", "1"), "n": ((), "count", "1"),
              "f": (("time", "cell"), "density", "sr-1")}
    data = {"times": np.array([0.0, 0.5, 1.0]), "w2": np.array([1.0, 0.5, 0.25]), "n": np.int64(7),
            "f": np.arange(6, dtype=np.float32).reshape(3, 2), "method": "rk4"}
    datafile.save(tmp_path / "a.nc", data, schema, "test", coords={"time": "times"}, compress=("f",))
    back = datafile.load(tmp_path / "a.nc")
    assert set(back) == set(data)
    for k in ("times", "w2", "f"):
        assert np.array_equal(back[k], data[k]) and back[k].dtype == np.asarray(data[k]).dtype
    assert int(back["n"]) == 7 and back["method"] == "rk4"
    with pytest.raises(datafile.SchemaError, match="'extra' has no schema entry"):
        datafile.save(tmp_path / "b.nc", {**data, "extra": np.zeros(3)}, schema, "test")
    with pytest.raises(datafile.SchemaError, match="'w2' has shape"):
        datafile.save(tmp_path / "c.nc", {**data, "w2": np.zeros((3, 1))}, schema, "test")
