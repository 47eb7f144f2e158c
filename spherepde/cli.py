"""The ``spherepde`` command line.

Commands
--------
spherepde run EXPERIMENT.toml|EXAMPLE [--output DIR] [--restart] [--no-figures]
    Run an experiment (resumes from DIR's checkpoint when there is one of the same configuration, and
    continues it when only a later time.t_end differs).
spherepde sweep SWEEP.toml [--output DIR] [--workers N | --scheduler ADDRESS] [--restart] [--check] [--continue-from DIR]
    Run a sweep (ensembles, parameter scans) on Dask; rerun to resume; ``--continue-from`` another sweep's
    directory runs its members on to a later t_end. See spherepde.sweeps.
spherepde plot RESULTS.h5 [--output DIR] [--kinds maps diagnostics ...]
    Figures (and ``--fits``) from a results file, without re-running.
spherepde validate [STUDY] [--quick] [--list]
    Run ``validation/<STUDY>/run.py`` (every study with a ``run.py`` when STUDY is omitted).
spherepde examples [NAME]
    List the packaged example configurations (``spherepde run NAME`` runs one), or print one's TOML.
spherepde info
    Versions, Numba threads and threading layer, CPU count.
spherepde --version
    The package version.

Exit status: 0 on success, 2 for a bad configuration or usage, 1 for other failures (for a sweep: a
member failed; for ``validate``: a study's criterion failed), 130 after Ctrl-C (the run resumes from
its last checkpoint when the same command is given again). Every error is one line on stderr.
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main", "build_parser", "discover_studies"]

log = logging.getLogger("spherepde.cli")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``spherepde run: error: ... (spherepde run --help)``, exit status 2
    (argparse prints the whole usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(prog="spherepde", description="Mean-field transformer continuity equation "
                "on the sphere: run experiments, plot results, validate.")
    p.add_argument("--version", action="version", version=f"spherepde {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bar")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run an experiment TOML file")
    r.add_argument("experiment", help="experiment configuration (TOML), or the name of a packaged example "
                   "(spherepde examples lists them)")
    r.add_argument("--output", "-o", help="results directory (default: output/<experiment file stem>)")
    r.add_argument("--restart", action="store_true", help="ignore an existing run in the output directory")
    r.add_argument("--no-figures", action="store_true", help="skip diagnostics post-processing and figures")
    r.add_argument("--check", action="store_true", help="validate the configuration and exit")

    sw = sub.add_parser("sweep", help="run a sweep of experiments (axes of config values) on Dask")
    sw.add_argument("spec", help="sweep file (TOML: a base experiment and axes), see docs/sweeps.md; or a "
                    "packaged example such as sweeps/beta_scan")
    sw.add_argument("--output", "-o", help="sweep directory (default: output/<sweep name>)")
    eng = sw.add_mutually_exclusive_group()
    eng.add_argument("--workers", "-w", type=int, help="LocalCluster worker processes (default: one per core, no more than the members to run)")
    eng.add_argument("--scheduler", help="address of a running Dask scheduler, e.g. tcp://10.0.0.1:8786")
    sw.add_argument("--restart", action="store_true", help="rerun every member from the start")
    sw.add_argument("--figures", action="store_true", help="per-member figures")
    sw.add_argument("--continue-from", nargs="+", metavar="DIR",
                    help="sweep directories whose members this sweep's continue to a later time.t_end (their "
                         "runs copied in and run on; the rest of each configuration unchanged)")
    sw.add_argument("--check", action="store_true", help="validate the sweep and every member's configuration, "
                    "list the members and exit")

    pl = sub.add_parser("plot", help="figures from a results file")
    pl.add_argument("results", help="results file (results.h5) or a results directory")
    pl.add_argument("--output", "-o", help="figure directory (default: <results dir>/figures)")
    pl.add_argument("--kinds", nargs="+", help="figure kinds (default: from the stored configuration)")
    pl.add_argument("--fits", action="store_true", help="also write HEALPix FITS maps of every saved time")

    v = sub.add_parser("validate", help="run validation studies (validation/<study>/run.py)")
    v.add_argument("study", nargs="?", help="study folder name (default: all)")
    v.add_argument("--quick", action="store_true", help="passed on to the study: a fast, coarse version")
    v.add_argument("--list", action="store_true", help="list the studies and exit")
    v.add_argument("--root", default=None, help="validation folder (default: ./validation, else the source "
                   "tree's of an editable install)")

    ex = sub.add_parser("examples", help="list the packaged example configurations, or print one")
    ex.add_argument("name", nargs="?", help="print this example's TOML (to copy and edit)")

    sub.add_parser("info", help="versions, threads, CPU count")
    return p


def _setup_logging(verbose: int, quiet: bool):
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("spherepde").setLevel(level)


# ----------------------------------------------------------------------------------------- commands
def _cmd_run(args) -> int:
    from .config import load_config
    from .runner import run_experiment

    from .runner import resolve_experiment

    path = resolve_experiment(args.experiment)
    cfg = load_config(path)
    if args.check:
        cfg.build_all()  # grid, model and f0 as the run builds them: a config that passes can run
        log.info("%s: configuration is valid", args.experiment)
        return 0
    out = Path(args.output) if args.output else Path("output") / path.stem
    result = run_experiment(cfg, out, restart=args.restart, progress=not args.quiet, figures=not args.no_figures)
    log.info("results: %s (%d saved times, %d steps, %.2f s)", out / "results.h5", len(result.times),
             result.n_steps, result.wall_time)
    return 0


def _cmd_sweep(args) -> int:
    from .sweeps import load_sweep, sweep

    from .runner import resolve_experiment

    spec = load_sweep(resolve_experiment(args.spec))
    if args.check:
        members = spec.members()
        print(f"{args.spec}: sweep {spec.name!r} is valid: {len(members)} members, dimensions "
              + " x ".join(f"{a.dim} ({len(a)})" for a in spec.axes))
        for m in members:
            print(f"  {m.dirname}  {m.label()}")
        return 0
    if args.workers is not None and args.workers < 1:
        raise _UsageError(f"--workers: got {args.workers}; allowed: an integer >= 1")
    out = Path(args.output) if args.output else Path("output") / spec.name
    ds = sweep(spec, out, workers=args.workers, scheduler=args.scheduler, progress=not args.quiet,
               restart=args.restart, figures=True if args.figures else None, quiet=args.quiet,
               continue_from=args.continue_from)
    n_failed = int((ds["status"] != "done").sum())
    log.info("sweep dataset: %s", out / "sweep.nc")
    return 1 if n_failed else 0


class _UsageError(ValueError):
    pass


def _cmd_plot(args) -> int:
    from . import io
    from .plotting import make_figures

    if args.kinds:
        from .config import PLOTS

        unknown = [k for k in args.kinds if k not in PLOTS]
        if unknown:
            raise _UsageError(f"--kinds: got {', '.join(map(repr, unknown))}; allowed: {', '.join(PLOTS)}")
    path = Path(args.results)
    if path.is_dir():
        path = path / "results.h5"
    if not path.is_file():
        raise FileNotFoundError(f"results file not found: {path}")
    try:
        result = io.load(path)
    except ValueError as exc:  # not a results file, or a damaged one (io.DamagedFileError): one line
        raise _UsageError(str(exc)) from None
    cfg = result.metadata.get("config")
    kinds = args.kinds or (list(cfg.output.plots) if cfg is not None else ["maps", "diagnostics"])
    if result.grid is None:
        log.error("%s: cannot rebuild the grid (no stored configuration)", path)
        return 1
    out = Path(args.output) if args.output else path.parent / "figures"
    if "concentration" in kinds and not result.metadata.get("concentration"):
        from .runner import concentration_series

        try:
            result.metadata["concentration"] = concentration_series(
                result, cfg.output.diagnostics_p if cfg else 0.25)
        except ValueError as exc:
            log.warning("concentration diagnostics skipped: %s", exc)
    written = make_figures(result, out, kinds=kinds)
    if args.fits:
        fd = out / "fits"
        fd.mkdir(parents=True, exist_ok=True)
        written += [io.write_fits(result, fd / f"density_{i:04d}.fits", i) for i in range(len(result.times))]
    for w in written:
        log.info("wrote %s", w)
    return 0


def validation_root() -> Path | None:
    """The validation folder: ``./validation`` when the working directory is a checkout, else the one of the
    source tree this package was installed from (an editable install), else None (a wheel ships no
    studies: they write their reports beside themselves and need the source tree)."""
    here = Path.cwd() / "validation"
    if here.is_dir():
        return here
    src = Path(__file__).resolve().parents[1] / "validation"
    if src.is_dir() and (src / "run_all.py").is_file():
        return src
    return None


def discover_studies(root=None) -> dict:
    """``{name: path to run.py}`` for every folder under ``root`` (default :func:`validation_root`) with a
    run.py."""
    root = Path(root) if root else validation_root()
    if root is None or not root.is_dir():
        return {}
    return {d.name: d / "run.py" for d in sorted(root.iterdir()) if d.is_dir() and (d / "run.py").is_file()}


def _cmd_validate(args) -> int:
    studies = discover_studies(args.root)
    if not studies:
        where = args.root or validation_root()
        raise FileNotFoundError(
            f"no validation studies (folders with a run.py) under {where}" if where else
            "no validation studies here: they are the validation/ folder of the source repository (this "
            "install has none); run from a checkout or pass --root DIR")
    if args.list:
        for name in studies:
            print(name)
        return 0
    if args.study:
        if args.study not in studies:
            log.error("unknown study %r; available: %s", args.study, ", ".join(studies))
            return 2
        studies = {args.study: studies[args.study]}
    failed = []
    for name, script in studies.items():
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        log.info("validate %s: %s", name, " ".join(cmd))
        rc = subprocess.call(cmd, cwd=script.parent.parent.parent)  # the studies import validation.*
        if rc != 0:
            failed.append(name)
            log.error("study %s failed (exit status %d)", name, rc)
    if failed:
        log.error("%d of %d studies failed: %s", len(failed), len(studies), ", ".join(failed))
        return 1
    return 0


def info_text() -> str:
    """Versions, Numba configuration and CPU count as text."""
    from .io import versions

    lines = [f"{k:12s} {v}" for k, v in versions().items()]
    try:
        import numba

        lines.append(f"{'numba threads':12s} {numba.get_num_threads()} (NUMBA_NUM_THREADS="
                     f"{os.environ.get('NUMBA_NUM_THREADS', 'unset')})")
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel region has run yet: run a tiny one to initialise it
            from numba import njit, prange

            @njit(parallel=True)
            def _touch(n):
                s = 0.0
                for i in prange(n):
                    s += i
                return s

            _touch(4)
            layer = numba.threading_layer()
        lines.append(f"{'threading':12s} {layer}")
        lines.append(f"{'jit disabled':12s} {bool(numba.config.DISABLE_JIT)}")
    except ImportError:  # pragma: no cover
        lines.append("numba        not importable")
    lines.append(f"{'cpu count':12s} {os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"
                 if hasattr(os, "sched_getaffinity") else f"{'cpu count':12s} {os.cpu_count()}")
    return "\n".join(lines)


def _cmd_examples(args) -> int:
    from .config import load_config
    from .runner import example_path, examples

    if args.name:
        sys.stdout.write(example_path(args.name).read_text())
        return 0
    for name, path in examples().items():
        if name.startswith("sweeps/"):
            from .sweeps import load_sweep

            desc = load_sweep(path).description
        else:
            desc = load_config(path).description
        print(f"{name:24s} {desc}")
    return 0


def _cmd_info(args) -> int:
    sys.stdout.write(info_text() + "\n")
    return 0


_COMMANDS = {"run": _cmd_run, "sweep": _cmd_sweep, "plot": _cmd_plot, "validate": _cmd_validate,
             "examples": _cmd_examples, "info": _cmd_info}


def main(argv=None) -> int:
    """Entry point of the ``spherepde`` command; returns the exit status."""
    # GNU OpenMP spin-waiting makes Numba's parallel regions 10x slower on a loaded machine (measured);
    # passive waiting costs nothing when idle. Effective before the first parallel launch only.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose, args.quiet)
    return guarded(_COMMANDS[args.command], args)


def guarded(call, *args) -> int:
    """``call(*args)`` with the command line's manners: a known error is one logged line and exit status 2
    (1 for a failed write), Ctrl-C says how to resume and exits 130; returns ``call``'s status otherwise.
    Used by ``spherepde`` and by the default experiment (``make run``)."""
    from .config import ConfigError
    from .runner import RunnerError

    try:
        return call(*args)
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    except (FileNotFoundError, RunnerError, _UsageError) as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: rerun the same command to resume from the last checkpoint")
        return 130
    except OSError as exc:  # disk full, a file-size limit, an I/O error: one line, what to do (io.WriteError)
        log.error("%s", exc)
        from .io import WriteError

        if isinstance(exc, WriteError):
            # HDF5 still holds the file whose write failed and crashes flushing it at interpreter exit
            # (SIGSEGV, measured): everything that matters is on disk (the last checkpoint), so leave now
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            logging.shutdown()
            os._exit(1)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
