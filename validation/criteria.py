"""Pass/fail criteria of the validation studies (issue #20 item 2).

A criterion is a dict ``{"criterion": statement, "measured": text, "target": text, "pass": bool}``.
Each study's ``run.py`` has a function ``criteria(results) -> list[dict]`` that evaluates its criteria from
the study's saved results JSON (parsed: a dict or a list, whatever the study writes), so they are checked

- at the end of a run: ``cli`` (the study's ``__main__``) runs the study, evaluates its criteria from the
  JSON the run wrote, writes them to ``criteria.json`` beside it (``criteria_quick.json`` etc. for other
  modes) and into the study's markdown report (a section between two markers), prints PASS/FAIL per
  criterion and exits 1 if any fails;
- from what is on disk: ``python validation/<study>/run.py --check-only [--results PATH]`` (no run) and
  ``python -m validation.run_all --skip-run``.

A study with no criterion evaluated (missing data) does not pass: ``exit_status([])`` is 1.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Callable, Iterable

VALID = Path(__file__).resolve().parent
BEGIN = "<!-- criteria: begin (validation/criteria.py) -->"
END = "<!-- criteria: end -->"

#: Mass is conserved by the finite-volume flux form up to rounding: relative drift above 1e-12 after a
#: few thousand steps would mean a non-conservative update (the studies measure <= 2e-15).
MASS_TOL = 1e-12


def fmt(x, spec: str = ".3g") -> str:
    """A measured number as text ('none' for None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "none"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return format(x, spec)
    return str(x)


def criterion(name: str, measured, target: str, passed: bool, spec: str = ".3g") -> dict:
    """One criterion: its statement, the measured value (formatted), the target as text, pass or fail."""
    return {"criterion": name, "measured": fmt(measured, spec), "target": target, "pass": bool(passed)}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def at_least(name: str, value, limit: float, spec: str = ".3g") -> dict:
    """value >= limit (a missing or NaN value fails)."""
    return criterion(name, value, f">= {fmt(limit, spec)}", _finite(value) and value >= limit, spec)


def at_most(name: str, value, limit: float, spec: str = ".3g") -> dict:
    """value <= limit (a missing or NaN value fails)."""
    return criterion(name, value, f"<= {fmt(limit, spec)}", _finite(value) and value <= limit, spec)


def mass_conserved(name: str, drift) -> dict:
    """Relative mass drift <= MASS_TOL (conservative flux form: rounding only)."""
    return at_most(f"{name}: mass conserved (relative drift)", drift, MASS_TOL, ".1e")


def positive(name: str, min_f) -> dict:
    """min f > 0 over the run (the positivity limiter; MODEL.md's minimal-density lemma: f_t stays positive)."""
    return criterion(f"{name}: density stays positive (min f)", min_f, "> 0", _finite(min_f) and min_f > 0, ".2e")


def n_failed(crits: Iterable[dict]) -> int:
    return sum(not c["pass"] for c in crits)


def exit_status(crits: list[dict]) -> int:
    """0 if there are criteria and all pass, else 1."""
    return 0 if crits and n_failed(crits) == 0 else 1


def summary(crits: list[dict]) -> str:
    """'PASS' / 'FAIL n of m' / 'no criteria'."""
    if not crits:
        return "no criteria"
    n = n_failed(crits)
    return "PASS" if n == 0 else f"FAIL {n} of {len(crits)}"


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|")


def table(crits: list[dict]) -> str:
    """Markdown table | criterion | measured | target | pass |."""
    if not crits:
        return "_(no criteria evaluated: results missing)_"
    lines = ["| criterion | measured | target | pass |", "|---|---|---|---|"]
    for c in crits:
        lines.append(f"| {_cell(c['criterion'])} | {_cell(c['measured'])} | {_cell(c['target'])} | "
                     f"{'PASS' if c['pass'] else '**FAIL**'} |")
    return "\n".join(lines)


def section(crits: list[dict], title: str = "## Criteria") -> str:
    """The markdown section written into a study's report (between markers, so it can be replaced)."""
    return "\n".join([BEGIN, title, "", f"Status: **{summary(crits)}**.", "", table(crits), END])


def strip_section(md: str) -> str:
    """A report without its criteria section (run_all renders the table itself)."""
    i = md.find(BEGIN)
    if i < 0:
        return md
    j = md.find(END, i)
    j = len(md) if j < 0 else j + len(END)
    return (md[:i].rstrip() + "\n" + md[j:].lstrip("\n")).rstrip() + "\n"


def write_section(md_path: Path, crits: list[dict]) -> None:
    """Replace (or append) the criteria section of a markdown report."""
    md_path = Path(md_path)
    old = strip_section(md_path.read_text()) if md_path.exists() else ""
    md_path.write_text(old.rstrip() + "\n\n" + section(crits) + "\n")


def print_report(name: str, crits: list[dict]) -> None:
    for c in crits:
        print(f"{'PASS' if c['pass'] else 'FAIL'}: {c['criterion']}: {c['measured']} (target {c['target']})")
    print(f"{name}: {summary(crits)}", flush=True)


def criteria_path(results_path: Path) -> Path:
    """criteria.json beside results.json (criteria_quick.json beside results_quick.json, ...)."""
    p = Path(results_path)
    stem = p.stem
    for base in ("results", p.parent.name):
        if stem.startswith(base):
            return p.with_name("criteria" + stem[len(base):] + ".json")
    return p.with_name(stem + "_criteria.json")


def evaluate(criteria_fn: Callable, results_path: Path) -> list[dict]:
    """The criteria of the results JSON at results_path ([] if it is missing or unreadable)."""
    try:
        data = json.loads(Path(results_path).read_text())
    except (OSError, ValueError):
        return []
    return criteria_fn(data)


def record(criteria_fn: Callable, results_path: Path, md_path: Path | None = None) -> list[dict]:
    """Evaluate from results_path, write criteria.json and the report's criteria section."""
    results_path = Path(results_path)
    crits = evaluate(criteria_fn, results_path)
    criteria_path(results_path).write_text(json.dumps(crits, indent=1) + "\n")
    md = Path(md_path) if md_path else results_path.with_suffix(".md")
    if md.exists():
        write_section(md, crits)
    return crits


def cli(name: str, criteria_fn: Callable, main: Callable, results_for: Callable, argv=None) -> int:
    """A study's ``__main__``: run it (``main(argv)``) and check its criteria, or only check.

    ``--check-only`` evaluates the criteria from the JSON on disk without running; ``--results PATH``
    points at another JSON (with ``--check-only``). ``results_for(argv)`` is the JSON a run with these
    arguments writes. Returns the exit status (1 if any criterion fails or the run fails).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--check-only", action="store_true")
    pre.add_argument("--results", default=None)
    opts, rest = pre.parse_known_args(argv)
    if opts.check_only:
        path = Path(opts.results) if opts.results else results_for(rest)
        crits = evaluate(criteria_fn, path)
        print(f"{name}: criteria of {path}")
        print_report(name, crits)
        return exit_status(crits)
    rc = main(rest)
    rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
    path = results_for(rest)
    crits = record(criteria_fn, path)
    print_report(name, crits)
    return max(rc, exit_status(crits))


def quick_results(here: Path) -> Callable:
    """The ``results_for`` of a study whose run writes results.json (results_quick.json with --quick)."""
    return lambda argv: Path(here) / ("results_quick.json" if "--quick" in argv else "results.json")


def save_outputs(here: Path, name: str, res: dict, quick: bool, write_md: Callable, plot: Callable,
                 suffix: str = "") -> None:
    """A study's outputs beside its run.py: results.json, results.md (``write_md(res, path)``) and
    <name>.png (``plot(res, path)``), each with the suffix _quick in quick mode, else ``suffix`` (a variant
    of the study, e.g. "_beta100")."""
    sfx = "_quick" if quick else suffix
    here = Path(here)
    (here / f"results{sfx}.json").write_text(json.dumps(res, indent=1))
    write_md(res, here / f"results{sfx}.md")
    plot(res, here / f"{name}{sfx}.png")


def load_study(name: str):
    """The module validation/<name>/run.py (importing it does not run the study)."""
    path = VALID / name / "run.py"
    if str(VALID.parent) not in sys.path:
        sys.path.insert(0, str(VALID.parent))
    spec = importlib.util.spec_from_file_location(f"_validation_{name}_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
