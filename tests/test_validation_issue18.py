"""Quick modes of the issue #18 studies (validation/bruno_circle, noisy_phase_transition): each runs into a
temporary folder and its criteria pass. Slow (30-60 s; noisy_phase_transition ~3 min with its near-sigma_c
part): kept out of the default run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validation import criteria as C  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("study", ["bruno_circle", "noisy_phase_transition"])
def test_quick_mode_passes_its_criteria(study, tmp_path, monkeypatch):
    mod = C.load_study(study)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    assert mod.main(["--quick"]) == 0
    res = json.loads((tmp_path / "results_quick.json").read_text())
    crits = mod.criteria(res)
    assert crits and all(c["pass"] for c in crits), [c for c in crits if not c["pass"]]
