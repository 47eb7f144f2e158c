"""Run an experiment configuration to a results directory, with checkpoints and resume.

Functions
---------
run_experiment(config, output, restart=False, progress=False, figures=True) -> Result
    Solve the configured problem, writing ``results.h5`` incrementally and ``checkpoint.h5``
    (atomically) every ``output.checkpoint_every`` seconds and at every save time. Called on a directory
    that holds a checkpoint of the same configuration, it resumes from it; the finished results are
    bit-for-bit those of an uninterrupted run.
postprocess(result, config, output, ...)
    Concentration diagnostics, the optional particle overlay, FITS maps and figures of a finished run.

A results directory holds::

    experiment.toml   the configuration as given
    results.h5        see spherepde.io
    checkpoint.h5     the last solver state (kept after completion, marked done)
    figures/          see spherepde.plotting
    fits/             density_NNNN.fits (when output.fits = true)

Why resuming is exact: the solver's whole state (time, density, step count, diagnostics so far, the
field history of ``field_interval``) is restored with ``Solver.set_state``; the step sequence depends on
nothing else, and the runner drives it with the same ``advance(save_time)`` calls either way. Frames
that the killed run wrote after its last checkpoint are dropped and recomputed identically. For the same
reason a finished run continues to a later ``time.t_end`` (the configuration otherwise unchanged) from its
final checkpoint, with the result of a run straight to the later time.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import warnings
from pathlib import Path

import numpy as np

from . import io as _io
from .config import ConfigError, ExperimentConfig, load_config, parse_config

__all__ = ["run_experiment", "postprocess", "RunnerError", "RESULTS_NAME", "CHECKPOINT_NAME", "examples",
           "example_path", "resolve_experiment"]

log = logging.getLogger(__name__)

RESULTS_NAME = "results.h5"
CHECKPOINT_NAME = "checkpoint.h5"
CONFIG_NAME = "experiment.toml"


class RunnerError(RuntimeError):
    """An output directory that cannot be used as asked (e.g. it holds a different experiment)."""


def examples() -> dict:
    """``{name: path}`` of the example configurations shipped with the package (``spherepde/examples``,
    also ``docs/examples`` in the source tree): experiments by stem, sweeps as ``sweeps/<stem>``."""
    from importlib.resources import files

    root = Path(str(files("spherepde") / "examples"))
    out = {p.stem: p for p in sorted(root.glob("*.toml"))}
    out.update({f"sweeps/{p.stem}": p for p in sorted((root / "sweeps").glob("*.toml"))})
    return out


def example_path(name) -> Path:
    """The file of the packaged example ``name`` (e.g. ``"paper_attention"``, ``"sweeps/beta_scan"``;
    a ``.toml`` suffix is allowed). FileNotFoundError naming the available ones otherwise."""
    key = str(name)[:-5] if str(name).endswith(".toml") else str(name)
    found = examples()
    if key not in found:
        raise FileNotFoundError(f"no packaged example {name!r}; available: {', '.join(found)}")
    return found[key]


def resolve_experiment(path_or_name) -> Path:
    """An experiment (or sweep) file: ``path_or_name`` itself when it exists, else the packaged example of
    that name (so ``spherepde run paper_attention`` works from any directory of a normal install)."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    try:
        return example_path(p.as_posix())
    except FileNotFoundError:
        what = "" if p.suffix == ".toml" or "/" in str(path_or_name) else \
            f" (nor a packaged example; available: {', '.join(examples())})"
        raise FileNotFoundError(f"experiment file not found: {p}" + (" (a directory)" if p.is_dir() else "")
                                + what) from None


def _as_config(config) -> ExperimentConfig:
    """The validated configuration a run computes with and records. An ExperimentConfig changed with
    ``dataclasses.replace`` no longer matches its source text; it is validated again from its objects,
    and that (``cfg.text`` written from them) is what ``experiment.toml`` and ``results.h5`` record."""
    if isinstance(config, ExperimentConfig):
        return config.validated()
    return load_config(config)


#: What the runner writes directly in a results directory (a symbolic link planted under one of these
#: names would redirect the write outside it), and the folders whose every entry it may write.
_WRITTEN = (CONFIG_NAME, RESULTS_NAME, RESULTS_NAME + ".tmp", CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp",
            "figures", "fits", ".run.lock")
_WRITTEN_DIRS = ("figures", "fits")


def _refuse_links(out: Path):
    """RunnerError if a name the runner writes in ``out`` (or anything in its figure folders) is a
    symbolic link: writes never follow links out of the results directory (issue #21 item 7)."""
    links = [out / n for n in _WRITTEN if (out / n).is_symlink()]
    for d in _WRITTEN_DIRS:
        if (out / d).is_dir() and not (out / d).is_symlink():
            links += [p for p in (out / d).iterdir() if p.is_symlink()]
    if links:
        raise RunnerError(f"{out} holds symbolic links where the run writes files ({', '.join(map(str, links))}); "
                          "remove them or use another --output (writes never follow links)")


@contextlib.contextmanager
def directory_lock(out: Path, name: str = ".run.lock", wait: float = 0.0):
    """An exclusive lock (flock on ``out/name``, released when the holder exits, even by SIGKILL) for one
    run: a second run on a live directory is refused instead of interleaving its writes with the first
    (issue #21 item 3), after waiting up to ``wait`` seconds for the holder (a sweep's members wait)."""
    fd = os.open(out / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 >= wait:
                    raise RunnerError(f"{out} is in use by another run (its lock {out / name} is held"
                                      + (f" for more than {wait:g} s" if wait else "")
                                      + "); wait for it to finish, or use another --output") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def _check_state(state: dict, t_end: float, save, n_saved: int):
    """ValueError unless a checkpoint's time and counters fit this run (t in [0, t_end], after the saved
    frames' times); the state itself is checked by ``Solver.set_state`` (issue #21 item 2)."""
    t = float(state["t"])
    if not (np.isfinite(t) and 0.0 <= t <= t_end) or not 0 <= n_saved <= len(save) \
            or (n_saved and t < save[n_saved - 1]) or int(state["n_steps"]) < 0:
        raise ValueError(f"the checkpoint's time {t} or counters do not fit this run")


def run_experiment(config, output, *, restart: bool = False, progress: bool = False, figures: bool = True,
                   stop_after_steps: int | None = None):
    """Run ``config`` (an ExperimentConfig or a TOML path) into the directory ``output``.

    Parameters
    ----------
    config : ExperimentConfig or path
    output : path
        Results directory (created). If it holds a checkpoint of the same configuration the run resumes;
        if that run is complete, the stored result is returned without recomputing. A configuration that
        differs from the stored run's only by a later ``time.t_end`` (its save times beginning with all of
        the stored run's) continues that run, complete or not, from its checkpoint: the frames already
        saved are kept, and the result is the one a run straight to the later t_end gives, bit for bit.
    restart : bool
        Ignore (and overwrite) an existing run in ``output``.
    progress : bool
        Progress bar with ETA on stderr (shown only on a terminal).
    figures : bool
        Post-process (concentration diagnostics, particle overlay, FITS, figures) after the run.
    stop_after_steps : int, optional
        Stop (as if killed, after a checkpoint) once the solver has taken this many steps in total;
        returns None. For tests and for splitting long runs into jobs.

    Returns
    -------
    spherepde.solver.Result (read back from ``results.h5``), or None if stopped early.

    Raises
    ------
    RunnerError
        ``output`` holds another configuration's run, is in use by a live run (an exclusive lock,
        ``.run.lock``), or has symbolic links where the run writes (writes never follow them).
    """
    cfg = _as_config(config)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    _refuse_links(out)
    with directory_lock(out):
        return _run_locked(cfg, out, restart, progress, figures, stop_after_steps)


def _same_config(stored, current: str, out: Path) -> bool:
    """Is the configuration a checkpoint was written for (its JSON, ``stored``) this run's (``current``)?
    Either the same JSON, or the same once read by this version's parser: a configuration written by an
    earlier version lacks the options added since, which then take their defaults (e.g. ``[scheme]
    field_time``), and it is the same experiment."""
    if stored == current:
        return True
    try:
        same = parse_config(json.loads(stored)).to_json() == current
    except (ConfigError, ValueError, TypeError):  # not readable as a configuration: not this one
        return False
    if same:
        log.info("%s: its checkpoint was written by an earlier version; the options it lacks take their "
                 "defaults", out)
    return same


def _extended(stored, cfg: ExperimentConfig) -> float | None:
    """The t_end of the run a checkpoint was written for (its configuration's JSON, ``stored``) when ``cfg``
    continues it: the same configuration but for a later ``time.t_end``, whose save times begin with all of
    that run's (so its saved frames are this run's first ones); None otherwise. The solver steps to each save
    time in turn and never looks further ahead, so the state at the earlier t_end, which is a save time of
    both, is the one an uninterrupted run to the later t_end reaches there."""
    try:
        old = parse_config(json.loads(stored))
    except (ConfigError, ValueError, TypeError):
        return None
    a, b = old.to_dict(), cfg.to_dict()
    t_old, t_new = a["time"].pop("t_end"), b["time"].pop("t_end")
    if a != b or not t_new > t_old:
        return None
    s_old, s_new = old.save_times(), cfg.save_times()
    return float(t_old) if len(s_old) <= len(s_new) and np.array_equal(s_new[:len(s_old)], s_old) else None


def _run_locked(cfg, out: Path, restart, progress, figures, stop_after_steps):
    """:func:`run_experiment` once the directory is checked and locked."""
    from .solver import Solver

    res_path, ck_path = out / RESULTS_NAME, out / CHECKPOINT_NAME
    cfg_json = cfg.to_json()

    state = extra = None
    if ck_path.exists() and res_path.exists() and not restart:
        try:
            state, extra = _io.read_checkpoint(ck_path)
        except Exception as exc:  # a damaged HDF5 file raises OSError, KeyError, RuntimeError, ValueError, ...
            state = extra = None
            log.warning("unreadable checkpoint %s (%s): starting over", ck_path, exc)
        if extra is not None and not _same_config(extra.get("config_json"), cfg_json, out):
            extends = _extended(extra.get("config_json"), cfg)
            if extends is None:
                raise RunnerError(f"{out} holds a run of a different configuration; use another --output or "
                                  "--restart to overwrite it (a run continues only to a later time.t_end with "
                                  "the rest of the configuration unchanged and its save times among the new ones)")
            log.info("%s: continuing its run from t_end = %g to %g", out, extends, cfg.time.t_end)
            extra["done"] = 0
            extra["continues"] = extra.get("config_json")
        if extra is not None and extra.get("done"):
            try:
                result = _io.load(res_path)
                stored = result.metadata.get("config")
                if stored is None or stored.to_json() != cfg_json:
                    raise ValueError("it holds the results of another configuration")
                if len(result.times) != len(cfg.save_times()):
                    raise ValueError(f"it holds {len(result.times)} saved frames, the run has {len(cfg.save_times())}")
                _io.check_frames(result.density, str(res_path))
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                log.warning("%s: the completed run's results are unusable (%s): starting over", out, exc)
                state = extra = None
            else:
                log.info("%s: run already complete, loading it", out)
                if figures:
                    postprocess(result, cfg, out)
                return result
    (out / CONFIG_NAME).write_text(cfg.text)

    grid, model, f0 = cfg.build_all()
    options = cfg.options()
    save = cfg.save_times()
    t_end = cfg.time.t_end
    solver = Solver(grid, model, f0, options)
    n_saved = 0
    wall_before = 0.0
    writer = None
    if state is not None:
        try:
            _check_state(state, t_end, save, int(extra["n_saved"]))
            writer = _io.ResultsWriter(res_path, cfg, solver.grid, options, model, resume=int(extra["n_saved"]),
                                       continues=extra.get("continues"))
            solver.set_state(state)
            n_saved = int(extra["n_saved"])
            wall_before = float(extra.get("wall_time", 0.0))
            log.info("resuming %s at t = %g (step %d, %d frames saved)", out, solver.t, solver.n_steps, n_saved)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log.warning("cannot resume from %s (%s): starting over", res_path, exc)
            if writer is not None:
                writer.close()
            writer = None
            solver = Solver(grid, model, f0, options)
    try:
        solver.check_step_budget(t_end)  # before any results file is written
    except ValueError as exc:
        if writer is not None:
            writer.close()
        from .config import ConfigError

        raise ConfigError("time.t_end", t_end, f"a run that fits scheme.max_steps: {exc}") from None
    if writer is None:
        writer = _io.ResultsWriter(res_path, cfg, solver.grid, options, model)  # the grid at t = 0 (refined on f0)

    start = time.perf_counter()
    ck_every = cfg.output.checkpoint_every
    last_ck = [time.perf_counter()]
    saved_count = [n_saved]

    def checkpoint(done=False):
        _io.write_checkpoint(ck_path, solver.get_state(), {
            "n_saved": saved_count[0], "wall_time": wall_before + time.perf_counter() - start,
            "config_json": cfg_json, "done": int(done)})
        last_ck[0] = time.perf_counter()

    bar = None
    if progress:
        from .progress import ProgressBar

        bar = ProgressBar(t_end)

    class _Stop(Exception):
        pass

    def callback(s):
        if bar is not None:
            bar.update(s.t, s.last_dt)
        if time.perf_counter() - last_ck[0] >= ck_every:
            checkpoint()
        if stop_after_steps is not None and s.n_steps >= stop_after_steps:
            checkpoint()
            raise _Stop

    try:
        for i in range(n_saved, len(save)):
            solver.advance(float(save[i]), callback)
            writer.append(solver.t, solver.f, solver.diagnostics(), solver.n_steps,
                          wall_before + time.perf_counter() - start, grid=solver.grid)
            saved_count[0] = i + 1
            checkpoint()
            solver.log_progress(log)
        solver.advance(t_end, callback)
    except _Stop:
        writer.close()
        if bar is not None:
            bar.close()
        return None
    except BaseException:
        writer.close()
        raise
    wall = wall_before + time.perf_counter() - start
    writer.finish(solver.diagnostics(), solver.n_steps, wall)
    writer.close()
    checkpoint(done=True)
    if bar is not None:
        bar.close()
    log.info("%s: %d steps to t = %g, solver wall time %.2f s", out, solver.n_steps, t_end, wall)
    result = _io.load(res_path)
    if figures:
        postprocess(result, cfg, out)
    return result


def concentration_series(result, p: float = 0.25) -> dict:
    """W2(rho_t, Pi#rho_0) and the alignments with E, F, F_abs at every saved time of ``result``.

    Needs a model with B and V (ZeroTemperature, Attention). Returns {} otherwise.
    """
    from .diagnostics import concentration_diagnostics
    from .spectral import limit_measure, spectral_data

    model = result.model
    if not (hasattr(model, "B") and hasattr(model, "V")):
        return {}
    grid = result.grid_at(0)
    s = spectral_data(model.B, model.V)
    w0 = result.density[0] * grid.areas
    limit = limit_measure(grid.centers, w0, model.B, model.V, spectral=s)
    keys = ("w2_limit", "alignment_E", "alignment_F", "alignment_F_abs", "V_p", "w2_floor", "w2_at_floor")
    out = {k: [] for k in keys}
    k = s.E.shape[0]
    p_eff = p if 2 * p < k else 0.5 * k * 0.5
    for i, f in enumerate(result.density):
        grid = result.grid_at(i)  # each saved state on its own cells (a grid that adapts)
        vp_grid = grid if getattr(grid, "dim", None) == 3 else None  # V_p's grid path (exact cell weights) on S^2
        d = concentration_diagnostics(grid.centers, f * grid.areas, model.B, model.V, p=p_eff, limit=limit,
                                      spectral=s, strict_vp=False, grid=vp_grid)
        for kk in keys:
            out[kk].append(d[kk])
    out = {kk: np.array(v, dtype=float) for kk, v in out.items()}
    out["times"] = np.asarray(result.times, dtype=float)
    out["p"] = np.array(p_eff)
    return out


def particle_overlay(result, cfg: ExperimentConfig) -> dict:
    """Run the ``[particles]`` overlay: tokens drawn from the grid's f0, integrated to the save times."""
    from .particles import simulate_particles
    from .sampling import sample_grid_density

    pc = cfg.particles
    x0 = sample_grid_density(result.grid_at(0), result.density[0], pc.n, rng=pc.seed)
    pr = simulate_particles(result.model, x0, cfg.time.t_end, pc.dt, save_at=np.asarray(result.times),
                            method=pc.method, hardmax=pc.hardmax, seed=[pc.seed, 1])  # noise: its own stream
    return {"times": pr.times, "positions": pr.positions, "weights": pr.weights}


def _particle_concentration(result, particles: dict, p: float) -> dict:
    """Concentration diagnostics of the particle overlay (keys prefixed ``particles_``)."""
    from .diagnostics import concentration_diagnostics
    from .spectral import limit_measure, spectral_data

    model = result.model
    s = spectral_data(model.B, model.V)
    x0, w = particles["positions"][0], particles["weights"]
    limit = limit_measure(x0, w, model.B, model.V, spectral=s)
    keys = ("w2_limit", "alignment_E", "alignment_F", "alignment_F_abs")
    out = {k: [] for k in keys}
    for x in particles["positions"]:
        with warnings.catch_warnings():  # tokens on E^perp (collapsed onto F) have V_p = inf: expected here
            warnings.filterwarnings("ignore", message="V_p = inf", category=RuntimeWarning)
            d = concentration_diagnostics(x, w, model.B, model.V, p=p, limit=limit, spectral=s, strict_vp=False)
        for k in keys:
            out[k].append(d[k])
    return {f"particles_{k}": np.array(v, dtype=float) for k, v in out.items()}


def postprocess(result, cfg: ExperimentConfig, output, figures: bool = True):
    """Concentration diagnostics, particle overlay, FITS maps and figures for a finished run.

    Groups already in the results file are not recomputed. Returns the list of files written.
    """
    out = Path(output)
    res_path = out / RESULTS_NAME
    meta = result.metadata
    written = []
    groups = {}
    if not meta.get("concentration"):
        try:
            conc = concentration_series(result, cfg.output.diagnostics_p)
        except (ValueError, np.linalg.LinAlgError) as exc:  # e.g. mass on E^perp with dim E >= 2
            log.warning("concentration diagnostics skipped: %s", exc)
            conc = {}
        if conc:
            groups["concentration"] = conc
            meta["concentration"] = conc
    if cfg.particles is not None and not meta.get("particles"):
        groups["particles"] = particle_overlay(result, cfg)
        meta["particles"] = groups["particles"]
        conc = groups.get("concentration")
        if conc:
            conc.update(_particle_concentration(result, groups["particles"], float(conc["p"])))
    if groups:
        import h5py

        with _io._writing(res_path), h5py.File(res_path, "a") as h:
            for name, data in groups.items():
                _io._write_dict_group(h, name, data)
    if cfg.output.fits and (getattr(result.grid, "nside", None) is not None or hasattr(result.grid, "uniq")):
        fd = out / "fits"
        fd.mkdir(exist_ok=True)
        for i in range(len(result.times)):
            written.append(_io.write_fits(result, fd / f"density_{i:04d}.fits", i))
    if figures and cfg.output.plots:
        from .plotting import make_figures

        written += make_figures(result, out / "figures", kinds=cfg.output.plots)
    return written
