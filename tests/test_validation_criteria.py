"""Issue #20 item 2: every validation study states its criteria, checks them and fails when one fails.

Before, only 2 of the 11 studies exited non-zero on a failed criterion (convergence_finite_beta printed
FAIL and exited 0), and docs/validation.md called every study "ok" (exit status 0). Now each
validation/<study>/run.py has ``criteria(results)``, evaluated from its results JSON on disk
(``--check-only``) or after a run, and run_all reports pass/fail per criterion. Fast: no study is run.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validation import criteria as C  # noqa: E402

STUDIES = sorted(p.parent.name for p in (ROOT / "validation").glob("*/run.py"))


def test_the_studies_are_all_there():
    assert len(STUDIES) >= 11, STUDIES


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_exposes_criteria_evaluated_from_disk(name):
    """Importing run.py does not run the study; its criteria come from the committed results JSON."""
    mod = C.load_study(name)
    assert callable(mod.criteria) and callable(mod.results_for)
    path = Path(mod.results_for([]))
    assert path.exists(), path
    crits = C.evaluate(mod.criteria, path)
    assert crits, name
    for c in crits:
        assert set(c) == {"criterion", "measured", "target", "pass"}, c
        assert isinstance(c["pass"], bool)


def _finite_beta_rows():
    mod = C.load_study("convergence_finite_beta")
    return mod, json.loads(mod.results_for([]).read_text())


def test_finite_beta_order_below_target_fails():
    """The study printed FAIL and exited 0; its criteria now fail and the exit status is 1."""
    mod, rows = _finite_beta_rows()
    assert C.exit_status(mod.criteria(rows)) == 0
    bad = copy.deepcopy(rows)
    last = max((r for r in bad if r["case"] == "paper" and r["beta"] == 10.0), key=lambda r: r["nside"])
    last["order_L1"] = 1.5
    crits = mod.criteria(bad)
    failed = [c for c in crits if not c["pass"]]
    assert len(failed) == 1 and "paper, beta 10" in failed[0]["criterion"] and failed[0]["measured"] == "1.50"
    assert C.exit_status(crits) == 1
    assert C.summary(crits) == f"FAIL 1 of {len(crits)}"


def test_missing_values_and_empty_criteria_fail():
    assert not C.at_least("x", float("nan"), 1.0)["pass"]
    assert not C.at_most("x", None, 1.0)["pass"]
    assert C.exit_status([]) == 1
    assert C.summary([]) == "no criteria"


def test_criteria_section_is_replaced_not_duplicated(tmp_path):
    md = tmp_path / "results.md"
    md.write_text("# Study\n\nbody\n")
    C.write_section(md, [C.at_least("order", 1.5, 1.8)])
    C.write_section(md, [C.at_least("order", 2.0, 1.8)])
    txt = md.read_text()
    assert txt.count(C.BEGIN) == 1 and "Status: **PASS**" in txt and "body" in txt
    assert C.strip_section(txt) == "# Study\n\nbody\n"


def test_run_all_status_per_study():
    from validation.run_all import status

    crits = [C.at_least("a", 2.0, 1.8), C.at_least("b", 1.0, 1.8)]
    assert status(None, {"crits": crits, "error": ""}) == "FAIL 1 of 2"
    assert status({"rc": None, "wall_s": None}, {"crits": crits[:1], "error": ""}) == "PASS"
    assert status({"rc": 3, "wall_s": 1.0}, {"crits": crits[:1], "error": ""}) == "run failed (rc 3)"
    assert status(None, {"crits": None, "error": "no results on disk"}) == "not run"


def test_check_only_exits_nonzero_on_a_failing_results_file(tmp_path):
    """A real process: run.py --check-only --results PATH exits 0 on the committed results and 1 on a copy
    whose finest order is below the target (the old script had no check and exited 0 after FAIL)."""
    _, rows = _finite_beta_rows()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(rows))
    bad_rows = copy.deepcopy(rows)
    for r in bad_rows:
        if r["case"] == "general" and r["beta"] == 100.0 and r["nside"] == max(q["nside"] for q in rows):
            r["order_L1"] = 1.2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(bad_rows))
    script = ROOT / "validation" / "convergence_finite_beta" / "run.py"
    cmd = [sys.executable, str(script), "--check-only", "--results"]
    ok = subprocess.run(cmd + [str(good)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    fail = subprocess.run(cmd + [str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert fail.returncode == 1, fail.stdout + fail.stderr
    assert "FAIL: general, beta 100: L1 order" in fail.stdout
