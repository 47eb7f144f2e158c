"""Results files that describe themselves (issue #20 item 7): a results file written by ``spherepde run``
is read by the ecosystem's own readers, without spherepde: xarray (through h5netcdf and through
netCDF4, i.e. the netCDF-C library) sees named dimensions, coordinates, units and long names, and the
configuration and versions as attributes.

This module does not import spherepde: the file is made by the command line in a subprocess, and the
reading happens in a subprocess where ``import spherepde`` is made to fail.
"""
import json
import subprocess
import sys
import textwrap

import pytest

from toml_configs import zero_temperature_run

TOML = zero_temperature_run("cf", tail="""[output]
plots = ["concentration"]
[particles]
n = 20
dt = 0.05
""")

READER = textwrap.dedent('''
    import json, sys
    sys.modules["spherepde"] = None          # any import of spherepde now fails
    import numpy as np, xarray as xr
    path, engine = sys.argv[1], sys.argv[2]
    ds = xr.open_dataset(path, engine=engine)
    out = {"dims": dict(ds.sizes), "coords": sorted(ds.coords), "vars": sorted(ds.data_vars),
           "attrs": {k: str(v) for k, v in ds.attrs.items()},
           "var_attrs": {k: {a: str(b) for a, b in ds[k].attrs.items()} for k in list(ds.variables)},
           "density_dims": list(ds.density.dims), "time": ds.time.values.tolist(),
           "mass": [float((ds.density.isel(time=i) * ds.cell_area).sum()) for i in range(ds.sizes["time"])]}
    for g in ("diagnostics", "concentration", "particles"):
        gd = xr.open_dataset(path, engine=engine, group=g)
        out[g] = {"dims": dict(gd.sizes), "var_attrs": {k: {a: str(b) for a, b in gd[k].attrs.items()}
                                                       for k in gd.variables}}
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def results_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cf")
    (d / "cf.toml").write_text(TOML)
    run = subprocess.run([sys.executable, "-m", "spherepde.cli", "-q", "run", str(d / "cf.toml"), "-o",
                          str(d / "out")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return d / "out" / "results.h5"


@pytest.mark.parametrize("engine", ["h5netcdf", "netcdf4"])
def test_xarray_reads_a_results_file_without_spherepde(results_file, engine):
    pytest.importorskip("netCDF4") if engine == "netcdf4" else None
    r = subprocess.run([sys.executable, "-c", READER, str(results_file), engine], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ds = json.loads(r.stdout)
    assert ds["dims"] == {"time": 3, "cell": 48, "component": 3}
    assert ds["density_dims"] == ["time", "cell"]
    assert {"time", "cell", "lon", "lat"} <= set(ds["coords"])
    assert ds["time"] == [0.0, 0.25, 0.5]
    # the density times the stored cell areas (sr) is the mass: conserved by the scheme to round-off, and
    # 1 up to the quadrature of the initial cell averages at nside 2 (a 48-cell grid)
    assert all(abs(m - ds["mass"][0]) < 1e-13 for m in ds["mass"]), ds["mass"]
    assert abs(ds["mass"][0] - 1.0) < 1e-3, ds["mass"]
    assert ds["var_attrs"]["density"]["units"] == "sr-1" and ds["var_attrs"]["cell_area"]["units"] == "sr"
    for group in (ds, ds["diagnostics"], ds["concentration"], ds["particles"]):
        for name, attrs in group["var_attrs"].items():
            assert attrs.get("long_name") and attrs.get("units"), (name, attrs)
    assert ds["diagnostics"]["dims"]["step"] > 1
    assert ds["particles"]["dims"] == {"time": 3, "particle": 20, "component": 3}
    a = ds["attrs"]
    assert a["Conventions"] == "CF-1.10"
    assert 'nside = 2' in a["config_toml"] and json.loads(a["config_json"])["grid"]["nside"] == 2
    assert "ducc0" in json.loads(a["versions"]) and "version_ducc0" in a
