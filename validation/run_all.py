"""Run every validation study's full mode and rebuild docs/validation.md.

``python -m validation.run_all`` (what ``make validate`` calls) runs each ``validation/*/run.py`` (full
mode, one subprocess each, in name order), records its wall time and exit status, then writes
docs/validation.md from each study's results.md (or, for studies without one, its other *.md report, else
its README.md) and figures (*.png; *.gif linked), with the machine and the wall times; after the summary
table, the section across studies of ``validation/terminal_phase.md``.

The studies run one after another (several time themselves and need a quiet machine); the scan
studies run their members as sweeps on Dask (``spherepde.sweep``: fig4_concentration, whose 30 + 2
members are the bulk of the run): on a LocalCluster of one worker per core by default, or on a running
Dask cluster with ``DASK_SCHEDULER_ADDRESS=tcp://host:8786 make validate``.

Pass/fail (issue #20 item 2): each study's ``criteria(results)`` (in its run.py, see
validation/criteria.py) is evaluated from the study's results JSON on disk, after its run or, with
``--skip-run``, from what is there. The summary table shows PASS / FAIL n of m / run failed (rc) / not
run per study, and each study's section its criteria table (criterion, measured, target, pass). The
command exits 1 if a study that was run failed (its exit status or a criterion).

Options: ``--skip-run`` rebuilds the report from what is on disk (wall times then come from each
study's results.json ``wall_total_s`` where present); ``--only NAME ...`` runs only those studies (the
report still covers all).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALID = ROOT / "validation"
DOC = ROOT / "docs" / "validation.md"
#: A section across the studies, placed after the summary table (validation/terminal_phase.md).
SYNTHESIS = VALID / "terminal_phase.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from validation import criteria as C  # noqa: E402


def studies():
    return sorted(p.parent for p in VALID.glob("*/run.py"))


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:
        load = ""
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}; {load} at report time"


def run_study(d: Path):
    t0 = time.perf_counter()
    print(f"== {d.name}", flush=True)
    proc = subprocess.run([sys.executable, str(d / "run.py")], cwd=ROOT)
    wall = time.perf_counter() - t0
    print(f"== {d.name}: rc {proc.returncode}, {wall:.0f} s", flush=True)
    return {"rc": proc.returncode, "wall_s": wall}


def study_criteria(d: Path) -> dict:
    """{"crits": list or None, "results": JSON path or None, "error": text} of a study, from disk."""
    try:
        mod = C.load_study(d.name)
        path = Path(mod.results_for([]))
    except Exception as exc:  # a study whose module does not load cannot be checked
        return {"crits": None, "results": None, "error": f"{type(exc).__name__}: {exc}"}
    if not path.exists():
        return {"crits": None, "results": path, "error": "no results on disk"}
    try:
        return {"crits": C.evaluate(mod.criteria, path), "results": path, "error": ""}
    except Exception as exc:
        return {"crits": None, "results": path, "error": f"criteria failed: {type(exc).__name__}: {exc}"}


def status(t: dict | None, c: dict) -> str:
    """PASS / FAIL n of m / run failed (rc) / not run, for the summary table."""
    crits = c["crits"]
    if t is not None and t["rc"] not in (0, None) and (crits is None or C.n_failed(crits) == 0):
        return f"run failed (rc {t['rc']})"
    if crits is None:
        return "not run" if c["error"] == "no results on disk" else "criteria not evaluated"
    return C.summary(crits)


def report_text(d: Path) -> tuple[str, str]:
    """(source file name, markdown) of a study's report."""
    if (d / "results.md").exists():
        src = d / "results.md"
    else:
        others = sorted(p for p in d.glob("*.md") if p.name != "README.md" and "quick" not in p.name)
        src = others[0] if others else (d / "README.md" if (d / "README.md").exists() else None)
    if src is None:
        return "", "_(no report on disk)_"
    txt = C.strip_section(src.read_text())  # the criteria table is rendered from the JSON (build)
    rel = f"../validation/{d.name}/"
    # relative links/images -> paths from docs/
    txt = re.sub(r"\]\((?!https?:|/|#|\.\./)([^)]+)\)", lambda m: f"]({rel}{m.group(1)})", txt)
    txt = re.sub(r"^(#+) ", lambda m: "##" + m.group(1) + " ", txt, flags=re.M)  # below the study's "##"
    return src.name, txt


def build(times: dict, checks: dict | None = None):
    """Write docs/validation.md; checks: study name -> study_criteria (evaluated here if missing)."""
    checks = dict(checks or {})
    for d in studies():
        if d.name not in checks:
            checks[d.name] = study_criteria(d)
    lines = ["# Validation report", "",
             f"Generated by `make validate` (`python -m validation.run_all`) on "
             f"{_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}.", "", f"Machine: {machine()}.", "",
             "Status: each study's criteria (stated in its run.py, `criteria`) evaluated from its results "
             "JSON on disk: PASS, FAIL n of m (n of its m criteria fail), run failed (rc) or not run. "
             "Runs marked from disk were not rerun for this report.", "",
             "| study | status | criteria passed | run | wall time |", "|---|---|---|---|---|"]
    total = 0.0
    for d in studies():
        t = times.get(d.name)
        c = checks[d.name]
        n = "-" if c["crits"] is None else f"{len(c['crits']) - C.n_failed(c['crits'])} / {len(c['crits'])}"
        run = "-" if t is None else ("from disk" if t["rc"] is None else f"rc {t['rc']}")
        w = "-"
        if t is not None:
            total += t["wall_s"] or 0.0
            w = f"{t['wall_s']:.0f} s" if t["wall_s"] is not None else "-"
        lines.append(f"| [{d.name}](#{d.name}) | {status(t, c)} | {n} | {run} | {w} |")
    lines += ["", f"Total wall time of the studies: {total / 60:.1f} min.", ""]
    if SYNTHESIS.exists():  # the hand-written reading across studies, each claim tied to its study
        lines += [SYNTHESIS.read_text().rstrip(), ""]
    for d in studies():
        src, txt = report_text(d)
        c = checks[d.name]
        lines += [f"## {d.name}", "", f"Source: `validation/{d.name}/{src}`; how to run and what to expect: "
                  f"[README](../validation/{d.name}/README.md).", ""]
        res = f"`{c['results'].relative_to(ROOT)}`" if c["results"] is not None else "-"
        lines += [f"### Criteria: {status(times.get(d.name), c)}", "",
                  f"Evaluated from {res} by `criteria` in `validation/{d.name}/run.py`"
                  + (f" ({c['error']})" if c["error"] else "") + ".", ""]
        if c["crits"] is not None:
            lines += [C.table(c["crits"]), ""]
        lines.append(txt.rstrip())
        shown = set(re.findall(r"\(\.\./validation/[^/]+/([^)]+\.png)\)", txt))
        extra = sorted(p.name for p in d.glob("*.png") if p.name not in shown and "quick" not in p.name)
        for name in extra:
            lines += ["", f"![{name}](../validation/{d.name}/{name})"]
        gifs = sorted(p.name for p in d.glob("*.gif") if "quick" not in p.name)
        if gifs:
            lines += ["", "Animations: " + ", ".join(f"[{g}](../validation/{d.name}/{g})" for g in gifs)]
        lines.append("")
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text("\n".join(lines) + "\n")
    print(f"wrote {DOC}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-run", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    times = {}
    t0 = time.perf_counter()
    for d in studies():
        if not a.skip_run and (a.only is None or d.name in a.only):
            times[d.name] = run_study(d)
        else:
            js = d / "results.json"
            w = None
            if js.exists():
                try:
                    w = json.loads(js.read_text()).get("wall_total_s")
                except (ValueError, AttributeError):
                    w = None
            times[d.name] = {"rc": None, "wall_s": w}
    checks = {d.name: study_criteria(d) for d in studies()}
    build(times, checks)
    failed = []
    for d in studies():
        st = status(times[d.name], checks[d.name])
        print(f"{d.name}: {st}", flush=True)
        if times[d.name]["rc"] is not None and st != "PASS":
            failed.append(d.name)
    print(f"run_all: {time.perf_counter() - t0:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""),
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
