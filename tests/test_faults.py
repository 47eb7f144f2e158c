"""Fault injection, the fast part of validation/fault_matrix.py (issue #21): every corruption class of a
checkpoint and of a results file gives a clean restart or a clear error, never a resumed run with garbage;
a full disk (a file-size limit) is one clear line and the rerun completes identical; the fast spectral
path resumes bit for bit (its history is checkpointed). The long matrix (SIGKILL trials on five paths, a
tmpfs, every class on a complete run) is ``python validation/fault_matrix.py``."""
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spherepde import io
from spherepde.config import parse_config
from spherepde.runner import CHECKPOINT_NAME, RESULTS_NAME, RunnerError, run_experiment
from spherepde.solver import Solver, solve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validation.fault_matrix import Matrix, config_text  # noqa: E402

TINY = config_text("zero_temperature", nside=4, t_end=4.0)


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _identical(res, ref):
    assert np.array_equal(res.times, ref.times) and np.array_equal(res.density, ref.density)
    assert res.n_steps == ref.n_steps
    for k in ref.diagnostics:
        assert np.array_equal(res.diagnostics[k], ref.diagnostics[k]), k


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A partial run (stopped after 40 steps: checkpoint + results with frames), a complete one, another
    configuration's complete run and the uninterrupted reference."""
    import numba

    numba.set_num_threads(1)
    base = tmp_path_factory.mktemp("faults")
    cfg = parse_config(TINY)
    run_experiment(cfg, base / "partial", figures=False, stop_after_steps=40)
    ref = run_experiment(cfg, base / "complete", figures=False)
    other = parse_config(TINY.replace("kappas = 3.0", "kappas = 5.0"))
    run_experiment(other, base / "other", figures=False)
    assert io.read_checkpoint(base / "partial" / CHECKPOINT_NAME)[1]["n_saved"] >= 1
    return cfg, ref, base


@pytest.mark.parametrize("cls", Matrix.CLASSES)
@pytest.mark.parametrize("target", ["checkpoint", "results_partial",
                                    # the complete run's classes: -m slow and validation/fault_matrix.py
                                    pytest.param("results_complete", marks=pytest.mark.slow)])
def test_every_corruption_class_restarts_cleanly_or_errors(prepared, tmp_path, target, cls):
    """18 classes x 3 targets. Allowed: the rerun equals the uninterrupted run bit for bit, or a
    RunnerError (another configuration's checkpoint: refused, not mixed). A complete run's damaged
    results file read by ``load`` is an error or the intact data, never other data."""
    cfg, ref, base = prepared
    src = base / ("complete" if target == "results_complete" else "partial")
    d = tmp_path / "run"
    shutil.copytree(src, d)
    name = CHECKPOINT_NAME if target == "checkpoint" else RESULTS_NAME
    Matrix(tmp_path).corrupt(d / name, cls, seed=len(cls), other=base / "other" / name)
    if target == "results_complete" and (d / RESULTS_NAME).exists():
        try:
            back = io.load(d / RESULTS_NAME)
        except (ValueError, OSError):
            pass
        else:
            if cls == "other_config":  # an intact file of another run: load says whose it is
                assert back.metadata["config"].to_json() != cfg.to_json()
            else:
                _identical(back, ref)  # a damage that left the data intact (e.g. bytes appended)
    try:
        res = run_experiment(cfg, d, figures=False)
    except RunnerError as exc:
        assert target == "checkpoint" and cls == "other_config", exc
        return
    _identical(res, ref)
    assert res.density.min() >= 0


def test_full_disk_is_one_line_and_the_rerun_completes_identical(prepared, tmp_path):
    """A file-size limit (RLIMIT_FSIZE, as a full disk) hit during the run: exit 1, one line naming the
    file and what to do (it segfaulted in h5py after a traceback cascade); the rerun with room resumes
    and equals the uninterrupted run."""
    cfg, ref, _ = prepared
    path = tmp_path / "c.toml"
    path.write_text(TINY)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "spherepde.cli", "-q", "run", str(path), "-o", str(out), "--no-figures"]
    env = dict(os.environ, NUMBA_NUM_THREADS="1")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (140000, 140000))  # the results file ends at 68 KB; each write asks 64 KB of room

    p = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "results.h5" in lines[0] and "file-size limit" in lines[0] and "rerun" in lines[0]
    assert (out / CHECKPOINT_NAME).exists()  # it got somewhere: the rerun resumes
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    _identical(io.load(out / RESULTS_NAME), ref)


def test_fast_spectral_path_resumes_bit_for_bit(tmp_path):
    """Issue #21 item 4: on the fast spectral path a resumed run differed (max 1.9e-10 in 65 of 81
    frames): the fast path's memory of how the in-house series did (which picks the method for the
    flagged targets) was not checkpointed; then, checkpointed after the step, it was counted twice on
    resume (the resumed solver recomputes the state's field). Stopped after 6 of 15 steps and resumed,
    the run equals the uninterrupted one bit for bit (it differed by 3e-16 with either mistake), and the
    resumed model's memory is the uninterrupted model's."""
    import numba

    numba.set_num_threads(2)  # the fast path's pool; the result does not depend on the thread count
    cfg = parse_config(config_text("fast_spectral", t_end=0.1, save_every=0.02))
    cfg = replace(cfg, output=replace(cfg.output, checkpoint_every=1e9))
    assert run_experiment(cfg, tmp_path / "a", figures=False, stop_after_steps=6) is None
    state, _ = io.read_checkpoint(tmp_path / "a" / CHECKPOINT_NAME)
    grid, model = cfg.build_grid(), cfg.build_model()
    at6, used = [], set()

    def memory(s):
        used.add(s.field_info.method)
        if s.n_steps == 6:
            at6.append(s.evaluators[""].memory["series_pass"])

    ref = solve(grid, model, cfg.build_initial(grid), cfg.time.t_end, save_at=cfg.save_times(), options=cfg.options(),
                callback=memory)
    assert used == {"fast_spectral"} and 0.0 < at6[0] < 0.9  # not the default: it matters
    s2 = Solver(grid, cfg.build_model(), cfg.build_initial(grid), cfg.options())
    s2.set_state(state)
    assert s2.evaluators[""].memory["series_pass"] == at6[0]
    res = run_experiment(cfg, tmp_path / "a", figures=False)
    _identical(res, ref)
