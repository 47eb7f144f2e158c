"""Installs that work outside the source tree (issue #20 item 8): the wheel, installed into a fresh virtual
environment, runs every CLI command from a temporary directory on its packaged examples.

The fresh environment gets the wheel and nothing else from this checkout; its third-party dependencies
come from the test environment through a ``.pth`` line (installing numba, scipy, dask, ... again would
download ~300 MB and take minutes). That line adds only a path: the test environment's own ``.pth``
files (the editable install of this checkout among them) are not processed, so ``import spherepde``
in the fresh environment can only find the wheel's copy, which the test asserts.
"""
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sh(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    build = _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(ROOT)],
                cwd=base)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((base / "dist").glob("spherepde-*.whl"))
    env = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    py = env / "bin" / "python"
    purelib = _sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base)
    Path(purelib.stdout.strip(), "test-env-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = _sh([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
               cwd=base)
    assert inst.returncode == 0, inst.stderr[-3000:]
    work = base / "elsewhere"
    work.mkdir()
    return env, work


def test_the_wheel_ships_the_examples_license_and_runs_from_anywhere(installed):
    env, work = installed
    exe = str(env / "bin" / "spherepde")
    where = _sh([str(env / "bin" / "python"), "-c", "import spherepde, spherepde.experiments.default as d; "
                 "print(spherepde.__file__); print(d.CONFIG.is_file())"], cwd=work)
    assert where.stdout.split()[0].startswith(str(env)), where.stdout  # the wheel's copy, not the checkout
    assert where.stdout.split()[1] == "True"  # the default experiment finds its configuration
    lic = list(env.glob("lib/python*/site-packages/spherepde-*.dist-info/licenses/LICENSE"))
    assert lic and "MIT License" in lic[0].read_text()

    version = _sh([exe, "--version"], cwd=work)
    assert version.returncode == 0 and version.stdout.strip().startswith("spherepde 0.")
    listed = _sh([exe, "examples"], cwd=work)
    assert listed.returncode == 0 and "paper_attention" in listed.stdout and "sweeps/beta_scan" in listed.stdout
    info = _sh([exe, "info"], cwd=work)
    assert info.returncode == 0 and "ducc0" in info.stdout
    assert _sh([exe, "-q", "run", "paper_attention", "--check"], cwd=work).returncode == 0
    assert _sh([exe, "-q", "sweep", "sweeps/beta_scan", "--check"], cwd=work).returncode == 0

    run = _sh([exe, "-q", "run", "prescribed_linear", "--output", "out", "--no-figures"], cwd=work)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (work / "out" / "results.h5").is_file() and (work / "out" / "experiment.toml").is_file()
    plot = _sh([exe, "-q", "plot", "out", "--kinds", "diagnostics"], cwd=work)
    assert plot.returncode == 0 and (work / "out" / "figures" / "diagnostics.png").is_file(), plot.stderr

    # a wheel has no validation studies (they are the source tree's): one line saying where they are
    val = _sh([exe, "validate", "--list"], cwd=work)
    assert val.returncode == 2 and len(val.stderr.strip().splitlines()) == 1
    assert "source repository" in val.stderr
