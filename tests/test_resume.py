"""Resume: a run killed with SIGKILL mid-run finishes, after resuming, bit-for-bit like an uninterrupted run."""
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from spherepde import io
from spherepde.cli import main
from spherepde.config import parse_config
from spherepde.runner import CHECKPOINT_NAME, RESULTS_NAME, RunnerError, run_experiment
from spherepde.solver import solve
from toml_configs import zero_temperature_run

TOML = zero_temperature_run("resume", nside=8, means="[[1, 1, 0]]", kappas=3.0, t_end=8.0, save_every=1.0,
                            tail="""[output]
checkpoint_every = 0.0   # after every step: many kill points
plots = []
""")


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def reference(cfg):
    grid, model = cfg.build_grid(), cfg.build_model()
    return solve(grid, model, cfg.build_initial(grid), cfg.time.t_end, save_at=cfg.save_times(),
                 options=cfg.options())


def assert_identical(res, ref):
    np.testing.assert_array_equal(res.times, ref.times)
    assert np.array_equal(res.density, ref.density)
    assert res.n_steps == ref.n_steps
    for k in ref.diagnostics:
        assert np.array_equal(res.diagnostics[k], ref.diagnostics[k]), k


def test_sigkill_then_resume_is_bit_for_bit(tmp_path):
    cfg_path = tmp_path / "resume.toml"
    cfg_path.write_text(TOML)
    out = tmp_path / "run"
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "spherepde.cli", "-q", "run", str(cfg_path), "--output",
                             str(out), "--no-figures"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    ck = out / CHECKPOINT_NAME
    deadline = time.time() + 120
    while not ck.exists():
        assert proc.poll() is None, f"run ended before any checkpoint: {proc.stderr.read().decode()}"
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.005)
    time.sleep(0.05)  # land somewhere inside the run, not on the first checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed: test is vacuous"
    state, extra = io.read_checkpoint(ck)
    assert not extra["done"] and state["t"] < 8.0
    killed_at = state["t"]

    assert main(["-q", "run", str(cfg_path), "--output", str(out), "--no-figures"]) == 0
    res = io.load(out / RESULTS_NAME)
    assert res.metadata["complete"]
    assert_identical(res, reference(parse_config(TOML)))
    assert killed_at < res.times[-1]


def test_resume_mid_interval_attention_with_field_history(tmp_path):
    """Stopping inside a save interval (field_interval history in the state) and resuming is exact."""
    text = TOML.replace('type = "zero_temperature"', 'type = "attention"\nbeta = 5.0').replace(
        "nside = 8", "nside = 4").replace("t_end = 8.0", "t_end = 2.0").replace(
        "[output]", "[scheme]\nfield_interval = 3\n[output]")
    cfg = parse_config(text)
    cfg = replace(cfg, output=replace(cfg.output, checkpoint_every=1e9))  # only the forced checkpoints
    assert run_experiment(cfg, tmp_path / "a", figures=False, stop_after_steps=5) is None
    state, extra = io.read_checkpoint(tmp_path / "a" / CHECKPOINT_NAME)
    assert state["n_steps"] == 5 and len(state["history"]) >= 1
    assert float(state["t"]) not in set(cfg.save_times().tolist())
    res = run_experiment(cfg, tmp_path / "a", figures=False)
    assert_identical(res, reference(cfg))


def test_complete_run_is_not_recomputed_and_other_config_refused(tmp_path):
    cfg = parse_config(TOML.replace("nside = 8", "nside = 2").replace("t_end = 8.0", "t_end = 0.5"))
    out = tmp_path / "c"
    first = run_experiment(cfg, out, figures=False)
    mtime = (out / RESULTS_NAME).stat().st_mtime_ns
    again = run_experiment(cfg, out, figures=False)
    assert (out / RESULTS_NAME).stat().st_mtime_ns == mtime
    assert np.array_equal(again.density, first.density)
    other = parse_config(TOML.replace("nside = 8", "nside = 2").replace("t_end = 8.0", "t_end = 0.25"))
    with pytest.raises(RunnerError, match="different configuration"):
        run_experiment(other, out, figures=False)
    assert run_experiment(other, out, figures=False, restart=True).times[-1] == 0.25


def test_a_checkpoint_of_an_earlier_version_is_the_same_configuration(tmp_path):
    """A checkpoint whose configuration lacks an option added since (``[scheme] field_time``, removed from
    its stored JSON as a version before that option wrote it) is the same experiment once read by this
    version's parser: the completed run is loaded, not recomputed. A changed value is still another
    configuration (refused)."""
    import json

    cfg = parse_config(TOML.replace("nside = 8", "nside = 2").replace("t_end = 8.0", "t_end = 0.5"))
    out = tmp_path / "c"
    first = run_experiment(cfg, out, figures=False)
    state, extra = io.read_checkpoint(out / CHECKPOINT_NAME)
    old = json.loads(extra["config_json"])
    del old["scheme"]["field_time"]
    io.write_checkpoint(out / CHECKPOINT_NAME, state, {**extra, "config_json": json.dumps(old, sort_keys=True)})
    mtime = (out / RESULTS_NAME).stat().st_mtime_ns
    again = run_experiment(cfg, out, figures=False)
    assert (out / RESULTS_NAME).stat().st_mtime_ns == mtime
    assert np.array_equal(again.density, first.density)
    old["scheme"]["rtol"] = 1e-5
    io.write_checkpoint(out / CHECKPOINT_NAME, state, {**extra, "config_json": json.dumps(old, sort_keys=True)})
    with pytest.raises(RunnerError, match="different configuration"):
        run_experiment(cfg, out, figures=False)


# ------------------------------------------------------------------ issue #21 items 3 and 7
def _tiny_cfg():
    from spherepde.config import parse_config

    return parse_config({"grid": {"type": "healpix", "nside": 2}, "time": {"t_end": 0.5, "save_every": 0.25},
                         "model": {"type": "zero_temperature", "B": "paper", "V": "paper"},
                         "output": {"plots": []}})


@pytest.mark.parametrize("name", ["checkpoint.h5.tmp", "results.h5.tmp", "experiment.toml", "results.h5",
                                  "figures/maps.png"])
def test_planted_symlinks_are_refused_and_nothing_outside_is_written(tmp_path, name):
    from spherepde.runner import RunnerError, run_experiment

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / name).symlink_to(victim)
    with pytest.raises(RunnerError, match="symbolic link"):
        run_experiment(_tiny_cfg(), out, figures=False)
    assert victim.read_text() == "precious"
    assert not (out / "checkpoint.h5").exists()  # refused before anything was written
    assert (out / "results.h5").is_symlink() or not (out / "results.h5").exists()


def test_a_second_run_on_a_live_directory_is_refused(tmp_path):
    import fcntl

    from spherepde.runner import RunnerError, run_experiment

    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".run.lock", "w") as fh:  # a live run holds the lock
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(RunnerError, match="in use by another run"):
            run_experiment(_tiny_cfg(), out, figures=False, restart=True)
        assert not (out / "results.h5").exists()
    r = run_experiment(_tiny_cfg(), out, figures=False)  # released: the run goes ahead
    assert len(r.times) == 3


def test_cli_second_run_on_a_live_directory_exits_2_and_the_first_completes(tmp_path):
    """The issue's scenario: `spherepde run cfg -o d &`, then `spherepde run cfg -o d --restart`. Before,
    the second truncated the first's results (7 of 21 frames, marked done)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from spherepde import load

    cfg = tmp_path / "c.toml"
    cfg.write_text('[grid]\ntype = "healpix"\nnside = 16\n[model]\ntype = "attention"\nB = "paper"\nV = "paper"\n'
                   'beta = 10.0\nmethod = "direct"\n[time]\nt_end = 1.0\nsave_every = 0.05\n'
                   '[output]\nplots = []\n')
    out = tmp_path / "d"
    cmd = [sys.executable, "-m", "spherepde.cli", "-q", "run", str(cfg), "-o", str(out), "--no-figures"]
    first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not (out / "checkpoint.h5").exists():  # the first run is under way
        assert first.poll() is None and time.monotonic() - t0 < 120
        time.sleep(0.05)
    # hold the first run where it is while the second starts: without this the first could finish during
    # the second's start-up on a loaded machine (seen with parallel test workers), and the second would
    # then rightly run; the stopped process keeps its lock, as a slow run does
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(cmd + ["--restart"], capture_output=True, text=True, timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2 and "in use by another run" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=300) == 0, first.stderr.read()
    r = load(out / "results.h5")
    assert len(r.times) == 21 and r.metadata["complete"]


# ------------------------------------------------------------------ issue #21 item 2 (validation part)
def _partial(tmp_path, steps=40):
    cfg = parse_config(TOML)
    out = tmp_path / "run"
    assert run_experiment(cfg, out, figures=False, stop_after_steps=steps) is None
    return cfg, out


@pytest.mark.parametrize("how", ["garbage_density", "bytes_1kb", "negative_time", "bit_flip", "results_bit_flip"])
def test_a_corrupted_checkpoint_is_not_resumed_and_the_run_is_right(tmp_path, how):
    """The issue: 1 KB overwritten in the middle of checkpoint.h5, then `spherepde run` exited 0 with a
    "complete" run of min density -1.46e303. The restored state is now checked (grid shape, finite,
    >= 0, the recorded mass, t in the run); a bad one is a clean restart, whose result is the
    uninterrupted run's, bit for bit."""
    import h5py

    cfg, out = _partial(tmp_path)
    ck = out / CHECKPOINT_NAME
    if how == "garbage_density":
        with h5py.File(ck, "a") as h:
            h["f"][3] = -1.46e303
    elif how == "negative_time":
        with h5py.File(ck, "a") as h:
            h.attrs["t"] = -5.0
    elif how in ("bit_flip", "results_bit_flip"):  # plausible: finite, >= 0, the mass to 1e-16 (checksums)
        target, name = (ck, "f") if how == "bit_flip" else (out / RESULTS_NAME, "density")
        with h5py.File(target, "a") as h:
            ds = h[name]
            idx = (3,) if ds.ndim == 1 else (ds.shape[0] - 1, 3)
            v = np.float64(ds[idx])
            ds[idx] = (v.view(np.uint64) ^ np.uint64(2)).view(np.float64)
    else:
        raw = bytearray(ck.read_bytes())
        mid = len(raw) // 2
        raw[mid:mid + 1024] = np.random.default_rng(0).integers(0, 256, 1024, dtype=np.uint8).tobytes()
        ck.write_bytes(bytes(raw))
    res = run_experiment(cfg, out, figures=False)
    assert_identical(res, reference(cfg))
    assert res.density.min() >= 0


def test_results_of_another_configuration_are_not_appended_to(tmp_path):
    """The issue: a results.h5 of another config copied into a partial run was appended to."""
    cfg, out = _partial(tmp_path)
    other = parse_config(TOML.replace("kappas = 3.0", "kappas = 5.0"))
    run_experiment(other, tmp_path / "other", figures=False)
    (out / RESULTS_NAME).write_bytes((tmp_path / "other" / RESULTS_NAME).read_bytes())
    res = run_experiment(cfg, out, figures=False)
    assert_identical(res, reference(cfg))
    assert io.load(out / RESULTS_NAME).metadata["config"].initial.kappas == [3.0]


def test_a_completed_run_with_a_damaged_frame_is_rerun(tmp_path):
    import h5py

    cfg = parse_config(TOML)
    out = tmp_path / "run"
    run_experiment(cfg, out, figures=False)
    with h5py.File(out / RESULTS_NAME, "a") as h:
        h["density"][2, 5] = np.nan
    res = run_experiment(cfg, out, figures=False)
    assert_identical(res, reference(cfg))


# ------------------------------------------------------------------ issue #20 item 1
def test_a_replaced_config_records_what_it_computed(tmp_path):
    """``dataclasses.replace`` on a parsed config: the run computes at nside 2 and records nside 2 in
    experiment.toml and results.h5 (before the fix it recorded the source text's nside 8, and the
    reloaded file disagreed with the returned result); ``spherepde plot`` on it works."""
    from spherepde.config import ConfigError, load_config

    src = parse_config(TOML)
    cfg = replace(src, grid=replace(src.grid, nside=2), time=replace(src.time, t_end=0.5, save_every=0.25))
    assert "nside = 2" in cfg.text and "nside = 8" not in cfg.text
    assert src.text == TOML  # an unchanged config keeps its source text, comments included
    out = tmp_path / "r"
    res = run_experiment(cfg, out, figures=False)
    assert res.density.shape == (3, 48)  # 12 * 2^2 cells
    assert load_config(out / "experiment.toml").to_json() == cfg.to_json()
    back = io.load(out / RESULTS_NAME)
    assert back.metadata["config"].to_json() == cfg.to_json()
    assert np.array_equal(back.density, res.density)
    assert main(["plot", str(out / RESULTS_NAME), "--output", str(tmp_path / "fig"), "--kinds", "maps"]) == 0
    # the replaced objects are validated again before anything runs
    bad = replace(src, grid=replace(src.grid, nside=0))
    with pytest.raises(ConfigError, match="grid.nside"):
        run_experiment(bad, tmp_path / "bad", figures=False)


def _attention_cfg(t_end: float, field_interval: int = 3, extra: str = ""):
    """An attention run with a field history (the state a continuation has to carry), nside 4."""
    text = TOML.replace('type = "zero_temperature"', 'type = "attention"\nbeta = 5.0').replace(
        "nside = 8", "nside = 4").replace("t_end = 8.0", f"t_end = {t_end}").replace(
        "save_every = 1.0", "save_every = 0.5" + extra).replace(
        "[output]", f"[scheme]\nfield_interval = {field_interval}\n[output]")
    cfg = parse_config(text)
    return replace(cfg, output=replace(cfg.output, checkpoint_every=1e9))


def test_a_finished_run_continues_to_a_later_t_end_bit_for_bit(tmp_path, request):
    """A complete run to t_end = 1 asked again with t_end = 2 (nothing else changed) continues from its
    final checkpoint: its two saved frames are kept, and the result is the run straight to 2, bit for bit
    (times, densities, step count, diagnostics). Continued once more to 2.5 it is again the straight run's.
    A continuation that would fail to carry the field history or the controller's state would differ in
    the step count or the densities."""
    out = tmp_path / "c"
    first = run_experiment(_attention_cfg(1.0), out, figures=False)
    assert first.times[-1] == 1.0 and io.read_checkpoint(out / CHECKPOINT_NAME)[1]["done"]
    taken = request.getfixturevalue("steps_taken")  # counted from here: the first run's steps are not
    res = run_experiment(_attention_cfg(2.0), out, figures=False)
    assert len(taken) == res.n_steps - first.n_steps > 0  # continued, not recomputed
    assert_identical(res, reference(_attention_cfg(2.0)))
    assert np.array_equal(res.density[:len(first.times)], first.density)
    assert res.metadata["config"].time.t_end == 2.0 and res.metadata["complete"]
    assert_identical(run_experiment(_attention_cfg(2.5), out, figures=False), reference(_attention_cfg(2.5)))
    # asked again at 2.5: complete, loaded, not recomputed
    mtime = (out / RESULTS_NAME).stat().st_mtime_ns
    run_experiment(_attention_cfg(2.5), out, figures=False)
    assert (out / RESULTS_NAME).stat().st_mtime_ns == mtime


def test_a_stopped_run_continues_to_a_later_t_end_bit_for_bit(tmp_path, request):
    """Stopped inside a save interval (mid field history) and resumed with a later t_end: the straight run."""
    out = tmp_path / "s"
    assert run_experiment(_attention_cfg(1.0), out, figures=False, stop_after_steps=7) is None
    state, extra = io.read_checkpoint(out / CHECKPOINT_NAME)
    assert not extra["done"] and 0 < state["t"] < 1.0 and len(state["history"]) >= 1
    taken = request.getfixturevalue("steps_taken")
    res = run_experiment(_attention_cfg(1.5), out, figures=False)
    assert len(taken) == res.n_steps - 7
    assert_identical(res, reference(_attention_cfg(1.5)))


def test_a_continuation_is_refused_unless_only_a_later_t_end_differs(tmp_path):
    """Refused, naming what continues: an earlier t_end; a later t_end with another key changed too; a later
    t_end whose save times do not begin with the stored run's (save at 0 and t_end only: the stored frame at
    the old t_end is not a save time of the new run)."""
    out = tmp_path / "r"
    run_experiment(_attention_cfg(1.0), out, figures=False)
    for other in (_attention_cfg(0.5), _attention_cfg(2.0, field_interval=4)):
        with pytest.raises(RunnerError, match="later time.t_end"):
            run_experiment(other, out, figures=False)
    ends = tmp_path / "e"
    cfg = _attention_cfg(1.0)
    run_experiment(replace(cfg, time=replace(cfg.time, save_every=None)), ends, figures=False)
    with pytest.raises(RunnerError, match="later time.t_end"):
        run_experiment(replace(cfg, time=replace(cfg.time, t_end=2.0, save_every=None)), ends, figures=False)
    # the refused runs left the stored one as it was: asked again, it is complete and loaded
    assert run_experiment(_attention_cfg(1.0), out, figures=False).times[-1] == 1.0
