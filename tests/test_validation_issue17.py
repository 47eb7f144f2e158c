"""The reduced cluster dynamics study (validation/cluster_dynamics, issue #17 item 2) in its quick mode: the
antipodal reduction equals the two-particle system, the closed-form Jacobians at +-e1 and on the stall cone
equal the numerical ones, and the stall is left at the predicted rate (seconds: ODEs only)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validation import criteria as C  # noqa: E402


def test_cluster_dynamics_quick_mode_passes_its_criteria(tmp_path, monkeypatch):
    mod = C.load_study("cluster_dynamics")
    monkeypatch.setattr(mod, "HERE", tmp_path)
    assert mod.main(["--quick"]) == 0
    res = json.loads((tmp_path / "results_quick.json").read_text())
    crits = mod.criteria(res)
    assert len(crits) == 21 and all(c["pass"] for c in crits), [c for c in crits if not c["pass"]]
    # the stall is left by the translation along e2 at rate 1 for every beta
    assert all(c["mode"].startswith("translation") and abs(c["most_unstable"] - 1.0) < 1e-6 for c in res["cone"])
