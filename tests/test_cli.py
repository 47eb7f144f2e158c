"""The command line end to end on a tiny configuration: run, plot, load, validate, info, bad configs."""
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from spherepde import io
from spherepde.cli import discover_studies, info_text, main
from toml_configs import zero_temperature_run

ROOT_DOCS = Path(__file__).resolve().parents[1] / "docs"

TINY = zero_temperature_run("tiny", tail="""[output]
fits = true
plots = ["maps", "diagnostics", "concentration", "particles"]
[particles]
n = 20
dt = 0.05
""")


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def test_run_plot_load_end_to_end(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    assert main(["-q", "run", str(cfg), "--output", str(out)]) == 0
    res = io.load(out / "results.h5")
    np.testing.assert_allclose(res.times, [0, 0.25, 0.5])
    assert res.density.shape == (3, 48) and res.metadata["complete"]
    assert abs(res.grid.mass(res.density[-1]) - res.grid.mass(res.density[0])) < 1e-13
    conc = res.metadata["concentration"]
    assert conc["w2_limit"].shape == (3,) and conc["particles_alignment_E"].shape == (3,)
    assert res.metadata["particles"]["positions"].shape == (3, 20, 3)
    assert (out / "experiment.toml").read_text() == TINY
    assert sorted(p.name for p in (out / "fits").iterdir()) == [f"density_000{i}.fits" for i in range(3)]
    figs = {p.name for p in (out / "figures").iterdir()}
    assert {"maps_mollweide.png", "diagnostics.png", "concentration.png", "particles_overlay.png"} <= figs
    # plot again from the file alone, elsewhere
    assert main(["-q", "plot", str(out / "results.h5"), "--output", str(tmp_path / "figs"),
                 "--kinds", "diagnostics", "maps"]) == 0
    assert {p.name for p in (tmp_path / "figs").iterdir()} == {"diagnostics.png", "maps_mollweide.png",
                                                               "maps_orthographic.png"}


def test_bad_config_exit_status_and_message(tmp_path, caplog):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(TINY.replace("nside = 2", "nside = 2\nresolution = 5"))
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert main(["run", str(cfg), "--output", str(tmp_path / "o")]) == 2
    assert "grid.resolution" in caplog.text and "unknown key" in caplog.text
    assert not (tmp_path / "o").exists()
    caplog.clear()
    cfg.write_text(TINY.replace("kappas = 2.0", "kappas = \"high\""))
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert main(["run", str(cfg), "--check"]) == 2
    assert "initial.kappas" in caplog.text and "'high'" in caplog.text
    cfg.write_text(TINY)
    assert main(["-q", "run", str(cfg), "--check"]) == 0
    assert main(["-q", "run", str(tmp_path / "missing.toml")]) == 2


def test_the_default_experiment_reports_bad_input_in_one_line(tmp_path, caplog):
    # make run (python -m spherepde.experiments.default) raised tracebacks on a bad configuration and on an
    # output directory that holds another configuration's run; it now has the CLI's manners
    from spherepde.experiments import default

    cfg = tmp_path / "bad.toml"
    cfg.write_text(TINY.replace("nside = 2", "nside = 0"))
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert default.main(["--config", str(cfg), "--output", str(tmp_path / "o")]) == 2
    assert len(caplog.records) == 1 and "grid.nside" in caplog.text
    caplog.clear()
    cfg.write_text(TINY)
    assert main(["-q", "run", str(cfg), "--output", str(tmp_path / "o"), "--no-figures"]) == 0
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("t_end = 0.5", "t_end = 0.25"))
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert default.main(["--config", str(other), "--output", str(tmp_path / "o")]) == 2
    assert len(caplog.records) == 1 and "different configuration" in caplog.text


@pytest.mark.parametrize("change, key", [
    # issue #21 item 10 / the fuzz matrix: these passed --check and then the run raised a traceback
    (("type = \"zero_temperature\"", "type = \"attention\"\nbeta = 1e308"), "model.beta"),
    (("t_end = 0.5", "t_end = 1e308"), "time.save_every"),
    (("kappas = 2.0", "kappas = 1e308"), "initial.kappas"),
])
def test_a_config_that_passes_check_can_run(tmp_path, caplog, change, key):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY.replace(*change))
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert main(["-q", "run", str(cfg), "--check"]) == 2
    assert key in caplog.text and len(caplog.records) == 1


def test_binary_config_file_is_one_line(tmp_path, caplog):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\x00\xff" * 40)
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        assert main(["-q", "run", str(cfg), "--check"]) == 2
    assert "UTF-8" in caplog.text


def test_validate_discovers_and_passes_quick(tmp_path):
    root = tmp_path / "validation"
    for name in ("study_a", "study_b"):
        (root / name).mkdir(parents=True)
        (root / name / "run.py").write_text(
            "import sys, pathlib\n"
            "pathlib.Path(__file__).with_name('ran.txt').write_text(' '.join(sys.argv[1:]))\n")
    (root / "not_a_study").mkdir()
    assert list(discover_studies(root)) == ["study_a", "study_b"]
    assert main(["-q", "validate", "study_b", "--quick", "--root", str(root)]) == 0
    assert (root / "study_b" / "ran.txt").read_text() == "--quick"
    assert not (root / "study_a" / "ran.txt").exists()
    assert main(["-q", "validate", "nope", "--root", str(root)]) == 2
    (root / "study_a" / "run.py").write_text("import sys\nsys.exit(3)\n")
    assert main(["-q", "validate", "--root", str(root)]) == 1


def test_info(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    for key in ("spherepde", "numba", "threading", "cpu count", sys.version.split()[0]):
        assert key in text
    assert info_text().splitlines()[0].startswith("python")


def test_run_on_the_circle_tensor_grid(tmp_path):
    pytest.importorskip("spherepde.grids.tensor")
    cfg = tmp_path / "circle.toml"
    cfg.write_text("""
[grid]
type = "tensor"
d = 2
n = 16
[model]
type = "zero_temperature"
B = [1, -1]
V = [1, 1]
[initial]
type = "vmf_mixture"
means = [[1, 1]]
kappas = 1.0
uniform_weight = 0.5
[time]
t_end = 0.5
save_every = 0.25
[output]
plots = ["maps", "diagnostics", "concentration"]
""")
    out = tmp_path / "out"
    assert main(["-q", "run", str(cfg), "--output", str(out)]) == 0
    res = io.load(out / "results.h5")
    assert res.grid.dim == 2 and res.density.shape == (3, 32)
    assert res.metadata["grid_attrs"]["type"] == "tensor"
    # A = V B^T = diag(1, -1): mass moves towards +-e1, so the alignment with E grows
    a = res.metadata["concentration"]["alignment_E"]
    assert a[-1] > a[0]
    assert {p.name for p in (out / "figures").iterdir()} == {"maps_circle.png", "diagnostics.png",
                                                           "concentration.png"}


# ------------------------------------------------------------------ issue #20 item 9: CLI manners
@pytest.mark.parametrize("argv, needle", [
    (["runn"], "invalid choice: 'runn'"),                      # a typo in the command
    (["run"], "required: experiment"),                          # a missing argument
    (["plot", "x.h5", "--kinds", "mapz"], "--kinds: got 'mapz'; allowed: maps"),  # a typo in --kinds
    (["plot", "missing.h5"], "results file not found"),
    (["run", "no_such_example"], "nor a packaged example; available: adaptive_clusters, attention_small_beta"),
    (["examples", "nope"], "no packaged example 'nope'"),
    (["validate", "--root", "nowhere"], "no validation studies"),
])
def test_each_bad_input_is_one_line_and_a_non_zero_status(tmp_path, monkeypatch, capsys, caplog, argv, needle):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR, logger="spherepde.cli"):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's errors
            rc = exc.code
    err = capsys.readouterr().err.strip()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] + (err.splitlines() if err else [])
    assert rc == 2, (rc, lines)
    assert len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in lines[0]


def test_version_and_packaged_examples(capsys):
    from spherepde import __version__
    from spherepde.runner import example_path, examples

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"spherepde {__version__}"
    assert main(["examples"]) == 0
    out = capsys.readouterr().out
    assert "paper_attention" in out and "Paper setting, beta = 100" in out
    assert main(["examples", "rigid_rotation"]) == 0
    assert capsys.readouterr().out == example_path("rigid_rotation").read_text()
    # docs/examples in the source tree is the packaged folder (one copy)
    assert (ROOT_DOCS / "examples" / "paper_attention.toml").resolve() == examples()["paper_attention"].resolve()


def test_validate_finds_the_source_trees_studies_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--list"]) == 0
    assert "time_accuracy" in capsys.readouterr().out.split()


def test_the_default_experiment_shows_the_phenomenon_and_says_what_it_shows(tmp_path):
    """Issue #20 item 4: the default experiment starts from a perturbed f0 (a uniform one never leaves E)
    and ends by saying what the run shows, phase by phase, with the measured times and the figures."""
    from dataclasses import replace

    from spherepde.config import load_config
    from spherepde.experiments.default import CONFIG, summary
    from spherepde.runner import run_experiment

    cfg = load_config(CONFIG)
    assert cfg.initial.type == "perturbed_uniform" and cfg.model.beta == 100.0 and cfg.time.t_end >= 50
    small = replace(cfg, grid=replace(cfg.grid, nside=2), time=replace(cfg.time, t_end=2.0, save_every=0.5),
                    output=replace(cfg.output, plots=("concentration",)),
                    particles=replace(cfg.particles, n=20, dt=0.05))
    res = run_experiment(small, tmp_path / "d")
    text = summary(res, tmp_path / "d")
    for needle in ("1. Concentration on E", "2. Exit from E", "3. Alignment with F", "Tokens (20,",
                   "not converged", "concentration.png"):
        assert needle in text, text
