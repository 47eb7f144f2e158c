"""API, CLI/config and extreme-physics fuzz matrix (issue #21): clear errors or correct answers, never a
silent wrong result, a hang or a traceback.

Three families, each case run in this process under a 120 s alarm:

* **API** -- every public constructor and function, each parameter given bad values in turn (None, a
  string, NaN, +-inf, -1, 0, 1e308, 1e-320, a bool, a complex, a list, an empty array, wrong shapes, NaN
  or negative entries, ...), the others valid.
* **CLI/config** -- a small valid experiment with every key set in turn to a bad value (a string, -1, 0,
  nan, inf, 1e308, a bool, a list, a table) or removed, unknown keys and sections, broken TOML, empty,
  binary, missing and directory paths; ``spherepde run --check`` and, where it passes, the run itself.
* **Extreme physics** -- valid but extreme runs: beta from 0 to 1e8, B and V scaled by 1e+-200, point
  masses, exact zeros, densities of 1e-300 and 1e300, t_end from 0 to 1e300, CFL 1 and 1e-6, nside 1,
  tensor grids in d = 2 and 4, coincident tokens under hardmax.

Outcomes: ``clear error`` (ValueError/TypeError, or exit 2 with one line, naming the parameter or key);
``correct`` (returned, and the result passes its check: finite, >= 0, mass conserved to 1e-10, unit
tokens, ...); and the failures ``UNCLEAR ERROR`` (another exception type, or a message that does not
name the parameter), ``SILENT WRONG`` (a result that fails its check), ``CHECK PASSES, RUN FAILS``,
``TRACEBACK`` and ``HANG``.

Usage: ``python validation/fuzz_matrix.py``; writes validation/fuzz_matrix.md (and .json).
"""
from __future__ import annotations

import json
import logging
import math
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import spherepde as sp  # noqa: E402

P = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
GOOD = ("clear error", "correct")


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang


def run_case(fn, names, check, limit=120):
    """Outcome of ``fn()``: an exception naming one of ``names`` is a clear error; a return value passing
    ``check`` is correct."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        out = fn()
    except Hang:
        return "HANG", f"over {limit} s"
    except (ValueError, TypeError, OverflowError, OSError) as exc:  # OSError: a missing or unreadable path
        msg = str(exc)
        if any(n in msg for n in names):
            return "clear error", f"{type(exc).__name__}: {msg[:110]}"
        return "UNCLEAR ERROR", f"{type(exc).__name__} not naming {names[0]}: {msg[:110]}"
    except Exception as exc:  # noqa: BLE001 - the point is to catch what escapes
        return "UNCLEAR ERROR", f"{type(exc).__name__}: {str(exc)[:110]}"
    finally:
        signal.alarm(0)
    try:
        ok, why = check(out)
    except Exception as exc:  # noqa: BLE001
        ok, why = False, f"check raised {type(exc).__name__}: {exc}"
    return ("correct", why) if ok else ("SILENT WRONG", why)


# ------------------------------------------------------------------------------------------ checks
def finite(a):
    a = np.asarray(a, dtype=float)
    return bool(np.all(np.isfinite(a)))


def check_grid(g):
    return (g.n_cells > 0 and finite(g.areas) and abs(g.areas.sum() / sp.grids.tensor.sphere_area(g.dim) - 1) < 1e-10,
            f"{g.n_cells} cells")


def check_result(r):
    d = r.density
    m = r.diagnostics["mass"]
    ok = finite(d) and d.min() >= 0 and abs(m[-1] - m[0]) <= 1e-10 * abs(m[0])
    return ok, f"{r.n_steps} steps, min {d.min():.3g}, mass drift {abs(m[-1] - m[0]) / abs(m[0]):.2g}"


def check_model(mdl):
    g = sp.HealpixGrid(2)
    v = mdl.field(g.centers, 0.0, g, np.ones(g.n_cells)) if not mdl.local else mdl.field(g.centers, 0.0)
    return finite(v), "field finite"


def check_points(x):
    x = np.asarray(x)
    return finite(x) and np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-12), f"shape {x.shape}"


def check_scalar(v):
    return np.isfinite(v) and v >= 0, f"{v:.4g}"


def check_particles(r):
    return check_points(r.positions.reshape(-1, r.positions.shape[-1]))


def check_any(_):
    return True, "returned"


# ------------------------------------------------------------------------------------------ API
SCALAR_BAD = {"None": None, "str": "x", "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-1": -1, "0": 0,
              "1e308": 1e308, "1e-320": 1e-320, "True": True, "complex": 1 + 1j, "list": [1, 2]}
ARRAY_BAD = {"None": None, "str": "x", "empty": np.zeros((0, 3)), "1-D": np.ones(3), "wrong shape": np.ones((2, 2)),
             "NaN": np.array([[np.nan, 0, 0], [0, 1, 0], [0, 0, 1]]), "inf": np.diag([np.inf, 1, 1]),
             "complex": np.eye(3) * (1 + 1j), "3-D": np.ones((3, 3, 3))}
WEIGHT_BAD = {"None": None, "negative": -np.ones(12), "zeros": np.zeros(12), "NaN": np.full(12, np.nan),
              "inf": np.full(12, np.inf), "wrong length": np.ones(5), "complex": np.ones(12) * 1j, "str": "x"}


def api_cases():
    g2 = sp.HealpixGrid(2)
    f2 = np.ones(g2.n_cells)
    att = sp.Attention(P, V, 5.0)
    x12 = sp.sample_uniform(12, rng=0)
    w12 = np.full(12, 1 / 12)
    cases = []

    def add(api, param, label, fn, check, names=None):
        cases.append((api, param, label, fn, check, names or (param,)))

    for lab, v in SCALAR_BAD.items():
        add("interaction_energy", "beta (log)", lab, lambda v=v: sp.interaction_energy(x12, w12, P, v, log=True),
            lambda e: (np.isfinite(e), f"{e:.4g}"), names=("beta",))
        add("HealpixGrid", "nside", lab, lambda v=v: sp.HealpixGrid(v), check_grid)
        add("TensorGrid", "d", lab, lambda v=v: sp.TensorGrid(v, 4), check_grid)
        add("TensorGrid", "n", lab, lambda v=v: sp.TensorGrid(3, v), check_grid)
        add("Attention", "beta", lab, lambda v=v: sp.Attention(P, V, v), check_model)
        add("Attention", "tol", lab, lambda v=v: sp.Attention(P, V, 5.0, tol=v), check_model)
        add("Attention", "method", lab, lambda v=v: sp.Attention(P, V, 5.0, method=v), check_model)
        add("solve", "t_end", lab, lambda v=v: sp.solve(g2, att, f2, v), check_result)
        for opt in ("cfl", "rtol", "atol", "max_dt", "field_interval", "max_steps", "stepper"):
            add("solve", opt, lab, lambda v=v, opt=opt: sp.solve(g2, att, f2, 0.2, **{opt: v}), check_result)
        add("simulate_particles", "dt", lab, lambda v=v: sp.simulate_particles(att, x12, 0.1, v), check_particles)
        add("simulate_particles", "t_end", lab, lambda v=v: sp.simulate_particles(att, x12, v, 0.01), check_particles)
        add("sample_vmf", "kappa", lab, lambda v=v: sp.sample_vmf(10, [0, 0, 1], v, rng=0), check_points)
        add("sample_vmf", "n", lab, lambda v=v: sp.sample_vmf(v, [0, 0, 1], 2.0, rng=0), check_points)
        add("sample_uniform", "d", lab, lambda v=v: sp.sample_uniform(5, v, rng=0), check_points)
        add("lyapunov_vp", "p", lab, lambda v=v: sp.lyapunov_vp(x12, w12, np.eye(3)[:1], v), check_scalar)
        add("interaction_energy", "beta", lab, lambda v=v: sp.interaction_energy(x12, w12, P, v), check_scalar)
    for lab, v in ARRAY_BAD.items():
        add("Attention", "B", lab, lambda v=v: sp.Attention(v, V, 5.0), check_model, names=("B", "V"))
        add("Attention", "V", lab, lambda v=v: sp.Attention(P, v, 5.0), check_model)
        add("ZeroTemperature", "B", lab, lambda v=v: sp.ZeroTemperature(v, V), check_model, names=("B", "V"))
        add("ZeroTemperature", "V", lab, lambda v=v: sp.ZeroTemperature(P, v), check_model)
        add("simulate_particles", "x0", lab, lambda v=v: sp.simulate_particles(att, v, 0.1, 0.01), check_particles)
        add("limit_measure", "points", lab, lambda v=v: sp.limit_measure(v, w12, P, V), check_any)
        add("wasserstein2", "points_a", lab, lambda v=v: sp.wasserstein2(v, w12, x12, w12), check_scalar)
    for lab, v in WEIGHT_BAD.items():
        add("solve", "f0", lab, lambda v=v: sp.solve(g2, att, v if not isinstance(v, np.ndarray) or v.shape != (12,)
                                                  else np.resize(v, g2.n_cells), 0.1), check_result)
        add("wasserstein2", "weights_a", lab, lambda v=v: sp.wasserstein2(x12, v, x12, w12), check_scalar)
        add("limit_measure", "weights", lab, lambda v=v: sp.limit_measure(x12, v, P, V), check_any)
        add("mean_field", "weights", lab, lambda v=v: att.mean_field(x12, x12, v), lambda m: (finite(m), "finite"))
        add("simulate_particles", "weights", lab, lambda v=v: sp.simulate_particles(att, x12, 0.1, 0.01, weights=v),
            check_particles)
        add("concentration_diagnostics", "weights", lab,
            lambda v=v: sp.concentration_diagnostics(x12, v, P, V), lambda d: (finite(list(d.values())[:3]), "finite"))
    for lab, v in {"str": "x", "list": [1], "None": None, "int": 3}.items():
        add("solve", "grid", lab, lambda v=v: sp.solve(v, att, f2, 0.1), check_result)
        add("solve", "model", lab, lambda v=v: sp.solve(g2, v, f2, 0.1), check_result)
        add("solve", "save_at", lab, lambda v=v: sp.solve(g2, att, f2, 0.2, save_at=v), check_result)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "garbage.h5").write_bytes(b"not hdf5" * 100)
    for lab, v in {"missing": tmp / "nope.h5", "garbage": tmp / "garbage.h5", "directory": tmp, "None": None}.items():
        add("load", "path", lab, lambda v=v: sp.load(v), check_any, names=("path", str(v), "results", "nope"))
    return cases


# ------------------------------------------------------------------------------------------ CLI/config
BASE = {
    "grid": {"type": '"healpix"', "nside": "2"},
    "model": {"type": '"attention"', "B": '"paper"', "V": '"paper"', "beta": "5.0", "tol": "1e-12", "method": '"auto"'},
    "initial": {"type": '"vmf_mixture"', "means": "[[1, 0, 0]]", "kappas": "2.0", "uniform_weight": "0.5"},
    "time": {"t_end": "0.2", "save_every": "0.1"},
    "scheme": {"scheme": '"linear"', "limiter": '"positivity"', "stepper": '"ssprk3"', "cfl": "0.4", "rtol": "1e-3",
               "field_interval": "2"},
    "output": {"checkpoint_every": "30.0", "plots": "[]", "fits": "false"},
    "particles": {"n": "20", "seed": "1", "dt": "0.05", "method": '"euler"'},
}
CFG_BAD = {"string": '"x"', "-1": "-1", "0": "0", "nan": "nan", "inf": "inf", "1e308": "1e308", "bool": "true",
           "list": "[1, 2]", "table": "{ a = 1 }"}


def toml_text(base):
    out = ['name = "fuzz"']
    for sec, kv in base.items():
        out.append(f"[{sec}]")
        out += [f"{k} = {v}" for k, v in kv.items()]
    return "\n".join(out) + "\n"


def cli_cases():
    cases = []
    for sec, kv in BASE.items():
        for key in kv:
            for lab, v in CFG_BAD.items():
                b = {s: dict(d) for s, d in BASE.items()}
                b[sec][key] = v
                cases.append((f"{sec}.{key}", lab, toml_text(b), (key,)))
            b = {s: dict(d) for s, d in BASE.items()}
            del b[sec][key]
            cases.append((f"{sec}.{key}", "removed", toml_text(b), (key,)))
        b = {s: dict(d) for s, d in BASE.items()}
        b[sec]["bogus_key"] = "1"
        cases.append((f"{sec}.bogus_key", "unknown key", toml_text(b), ("bogus_key",)))
    cases.append(("[bogus]", "unknown section", toml_text(BASE) + "[bogus]\na = 1\n", ("bogus",)))
    cases.append(("file", "TOML syntax", toml_text(BASE).replace("nside = 2", "nside = = 2"), ("TOML", "line", "toml")))
    cases.append(("file", "empty", "", ("grid", "missing", "empty")))
    cases.append(("file", "binary", "\x00\x01\xff" * 50, ("TOML", "toml", "decode", "UTF")))
    return cases


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def run_cli(args):
    from spherepde.cli import main

    h = _Collect()
    logging.getLogger().addHandler(h)
    try:
        rc = main(args)
    finally:
        logging.getLogger().removeHandler(h)
    return rc, h.lines


def cli_case(key, lab, text, names, work: Path, i: int):
    cfg = work / f"c{i}.toml"
    if lab == "binary":
        cfg.write_bytes(text.encode("latin-1"))
    else:
        cfg.write_text(text)
    out = work / f"o{i}"
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        rc, lines = run_cli(["-q", "run", str(cfg), "-o", str(out), "--check"])
        if rc != 0:
            named = any(n in " ".join(lines) for n in names)
            ok = rc == 2 and len(lines) == 1 and named
            return ("clear error" if ok else "UNCLEAR ERROR"), f"exit {rc}: {' / '.join(lines)[:120]}"
        rc, lines = run_cli(["-q", "run", str(cfg), "-o", str(out), "--no-figures"])
        if rc != 0:
            return "CHECK PASSES, RUN FAILS", f"exit {rc}: {' / '.join(lines)[:120]}"
        return (("correct",) + (check_result(sp.load(out / "results.h5"))[1],)) if check_result(
            sp.load(out / "results.h5"))[0] else ("SILENT WRONG", check_result(sp.load(out / "results.h5"))[1])
    except Hang:
        return "HANG", "over 120 s"
    except SystemExit as exc:
        return ("clear error" if exc.code == 2 else "UNCLEAR ERROR"), f"argparse exit {exc.code}"
    except Exception as exc:  # noqa: BLE001
        return "TRACEBACK", f"{type(exc).__name__}: {str(exc)[:100]} @ {traceback.extract_tb(exc.__traceback__)[-1].name}"
    finally:
        signal.alarm(0)


def cli_path_cases(work: Path):
    res = []
    for lab, path in (("missing file", work / "missing.toml"), ("directory", work)):
        signal.alarm(60)
        try:
            rc, lines = run_cli(["-q", "run", str(path), "--check"])
            ok = rc == 2 and len(lines) == 1
            res.append(("path", lab, "clear error" if ok else "UNCLEAR ERROR", f"exit {rc}: {' / '.join(lines)[:100]}"))
        except Exception as exc:  # noqa: BLE001
            res.append(("path", lab, "TRACEBACK", f"{type(exc).__name__}: {exc}"))
        finally:
            signal.alarm(0)
    return res


# ------------------------------------------------------------------------------------------ extreme physics
def physics_cases():
    g4, g8 = sp.HealpixGrid(4), sp.HealpixGrid(8)
    pert = lambda g: 1.0 + 0.3 * g.centers[:, 0] * g.centers[:, 1] + 0.2 * g.centers[:, 2]  # noqa: E731
    mu = np.array([0.3, 0.5, 0.8]) / np.linalg.norm([0.3, 0.5, 0.8])
    c = []

    def add(label, fn, names=("t_end",), check=check_result):
        c.append((label, fn, names, check))

    for beta in (0.0, 1e-300, 1e-8, 1e4, 1e6, 1e8):
        add(f"beta = {beta:g}", lambda b=beta: sp.solve(g4, sp.Attention(P, V, b), pert(g4), 0.05))
    for s in (1e-200, 1e200):
        add(f"Attention B x {s:g}", lambda s=s: sp.solve(g4, sp.Attention(s * P, V, 5.0), pert(g4), 0.05),
            names=("B", "beta"))
        add(f"ZeroTemperature B x {s:g}", lambda s=s: sp.solve(g4, sp.ZeroTemperature(s * P, V), pert(g4), 0.2))
    add("V x 1e-200", lambda: sp.solve(g4, sp.Attention(P, 1e-200 * V, 5.0), pert(g4), 0.2))
    add("V x 1e100", lambda: sp.solve(g4, sp.Attention(P, 1e100 * V, 5.0), pert(g4), 1.0), names=("t_end", "max_steps"))
    one = np.zeros(g8.n_cells)
    one[17] = 1.0 / g8.areas[17]
    add("point mass (one cell)", lambda: sp.solve(g8, sp.Attention(P, V, 50.0), one, 0.1))
    add("exact zeros, kappa 1e4", lambda: sp.solve(g8, sp.Attention(P, V, 1e4), (g8.centers @ mu > 0.9) * 1.0, 0.01))
    add("density x 1e-300", lambda: sp.solve(g4, sp.Attention(P, V, 5.0), 1e-300 * pert(g4), 0.1))
    add("density x 1e300", lambda: sp.solve(g4, sp.Attention(P, V, 5.0), 1e300 * pert(g4), 0.1))
    add("subnormal density", lambda: sp.solve(g4, sp.Attention(P, V, 5.0), 1e-310 * pert(g4), 0.1))
    add("t_end = 0", lambda: sp.solve(g4, sp.Attention(P, V, 5.0), pert(g4), 0.0))
    add("t_end = 1e-300", lambda: sp.solve(g4, sp.Attention(P, V, 5.0), pert(g4), 1e-300))
    add("t_end = 1e300", lambda: sp.solve(g4, sp.ZeroTemperature(P, V), pert(g4), 1e300), names=("t_end", "max_steps"))
    add("cfl = 1", lambda: sp.solve(g4, sp.ZeroTemperature(P, V), pert(g4), 2.0, cfl=1.0))
    add("cfl = 1e-6", lambda: sp.solve(g4, sp.ZeroTemperature(P, V), pert(g4), 0.01, cfl=1e-6),
        names=("t_end", "max_steps", "cfl"))
    add("nside 1", lambda: sp.solve(sp.HealpixGrid(1), sp.Attention(P, V, 5.0), np.ones(12), 0.5))
    t2 = sp.TensorGrid(2, 64)
    add("TensorGrid d=2, beta 1e4",
        lambda: sp.solve(t2, sp.Attention(np.diag([1.0, -1.0]), np.eye(2), 1e4), 1 + 0.5 * t2.centers[:, 0], 0.05))
    t4 = sp.TensorGrid(4, 6)
    add("TensorGrid d=4 zero temperature",
        lambda: sp.solve(t4, sp.ZeroTemperature(np.diag([-1.0, -1, 1, 1]), np.diag([-1.0, 1, -2, 1])), np.ones(t4.n_cells),
                         0.1))
    x_same = np.tile([[0.0, 0.0, 1.0]], (5, 1))
    add("coincident tokens, hardmax", lambda: sp.simulate_particles(sp.Attention(P, V, 5.0), x_same, 0.5, 0.01,
                                                                    hardmax=True), check=check_particles)
    add("one token", lambda: sp.simulate_particles(sp.Attention(P, V, 5.0), [[0.0, 0.6, 0.8]], 0.5, 0.01),
        check=check_particles)
    add("tol = 1e-16", lambda: sp.solve(g4, sp.Attention(P, V, 5.0, tol=1e-16), pert(g4), 0.05), names=("tol",))
    add("spectral at beta 1e4", lambda: sp.solve(g4, sp.Attention(P, V, 1e4, method="spectral"), pert(g4), 0.01))
    add("rtol 1e-10", lambda: sp.solve(g4, sp.ZeroTemperature(P, V), pert(g4), 0.2, rtol=1e-10))
    return c


# ------------------------------------------------------------------------------------------ driver
def main():
    logging.getLogger("spherepde").setLevel(logging.ERROR)
    import warnings

    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    rows = []
    for api, param, lab, fn, check, names in api_cases():
        o, d = run_case(fn, names, check)
        rows.append({"family": "API", "target": f"{api}({param})", "value": lab, "outcome": o, "detail": d})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, (key, lab, text, names) in enumerate(cli_cases()):
            o, d = cli_case(key, lab, text, names, work, i)
            rows.append({"family": "CLI/config", "target": key, "value": lab, "outcome": o, "detail": d})
        for key, lab, o, d in cli_path_cases(work):
            rows.append({"family": "CLI/config", "target": key, "value": lab, "outcome": o, "detail": d})
    for label, fn, names, check in physics_cases():
        o, d = run_case(fn, names, check, limit=300)
        rows.append({"family": "extreme physics", "target": label, "value": "", "outcome": o, "detail": d})
    wall = time.perf_counter() - t0
    fams = {}
    for r in rows:
        fams.setdefault(r["family"], Counter())[r["outcome"]] += 1
    bad = [r for r in rows if r["outcome"] not in GOOD]
    lines = ["# Fuzz matrix (issue #21)", "", f"`python validation/fuzz_matrix.py`: {len(rows)} cases in {wall:.0f} s; "
             f"{len(bad)} failures (outcomes other than a clear error or a correct result).", "",
             "| family | cases | outcomes |", "|---|---|---|"]
    for f, cnt in fams.items():
        lines.append(f"| {f} | {sum(cnt.values())} | " + ", ".join(f"{k}: {v}" for k, v in sorted(cnt.items())) + " |")
    if bad:
        lines += ["", "## Failures", "", "| family | target | value | outcome | detail |", "|---|---|---|---|---|"]
        lines += [f"| {r['family']} | {r['target']} | {r['value']} | {r['outcome']} | {r['detail'].replace('|', '/')} |"
                  for r in bad]
    lines += ["", "## Every case", "", "| family | target | value | outcome | detail |", "|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['target']} | {r['value']} | {r['outcome']} | {r['detail'].replace('|', '/')} |"
              for r in rows]
    (HERE / "fuzz_matrix.md").write_text("\n".join(lines) + "\n")
    (HERE / "fuzz_matrix.json").write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=1))
    print("\n".join(lines[:12 + len(bad) + 4]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
