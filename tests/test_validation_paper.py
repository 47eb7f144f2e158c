"""Quick modes of the paper studies (validation/fig3_density, fig4_concentration, appendix_c), asserting
what each study establishes. Outputs go to a temporary folder (the studies' HERE is redirected)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validation.appendix_c import run as appc  # noqa: E402
from validation.fig3_density import run as fig3  # noqa: E402
from validation.fig3_density.common import transition_time  # noqa: E402
from validation.fig4_concentration import run as fig4  # noqa: E402


def test_transition_time_definition():
    t = np.arange(6.0)
    aE = np.array([1 / 3, 0.9, 0.9, 0.6, 0.2, 0.1])
    aF = np.array([1 / 3, 0.05, 0.05, 0.3, 0.7, 0.8])
    # crossing between t = 3 (d = -0.3) and t = 4 (d = +0.5): 3 + 0.3 / 0.8
    assert transition_time(t, aE, aF) == pytest.approx(3.375)
    assert np.isnan(transition_time(t, aE, np.zeros(6)))
    # E-alignment 0.9 (not > 0.9) never exceeds the 0.9 level: no exit defined
    assert np.isnan(fig4.exit_time(t, aE))
    assert fig4.exit_time(t, aE + 0.05) == pytest.approx(2 + 0.05 / 0.3)


@pytest.mark.slow  # a study run (8-12 s): out of the default run, which must stay under 10 minutes
def test_fig4_quick_E_first_and_beta_inf_stays_on_E(tmp_path, monkeypatch):
    monkeypatch.setattr(fig4, "HERE", tmp_path)
    fig4.main(["--quick"])
    res = json.loads((tmp_path / "results_quick.json").read_text())
    runs = {r["beta"]: r for r in res["runs"]}
    b100, binf = runs["100"], runs["inf"]
    # beta = 100: the E-alignment rises first (towards Pi#rho_0), the F-alignment falls, W2 decreases
    aE, aF = np.array(b100["align_E"]), np.array(b100["align_F"])
    assert aE[0] == pytest.approx(1 / 3, abs=0.01)
    assert aE[4] > 0.8 > aF[4] + 0.6  # t = 1
    assert b100["W2"][-1] < 0.5 * b100["W2"][0]
    # beta = inf: E-alignment increases monotonically, F never overtakes
    aE, aF = np.array(binf["align_E"]), np.array(binf["align_F"])
    assert np.all(np.diff(aE) >= -1e-12)
    assert np.all(aF[1:] < aE[1:])
    assert np.isnan(binf["t_EF"])
    assert np.all(np.diff(binf["W2"]) <= 1e-12)
    # the 200-token run (beta = 100) also concentrates on E first
    p = res["particles"]["100"][0]
    assert p["align_E"][4] > 0.8 and p["align_F"][4] < 0.2
    for name in ("results_quick.md", "curves_quick.png", "transition_quick.png", "minw2_quick.png"):
        assert (tmp_path / name).exists()


def test_appendix_c_quick_energy_monotone(tmp_path, monkeypatch):
    monkeypatch.setattr(appc, "HERE", tmp_path)
    res = appc.main(["--quick"])
    cases = {r["case"]: r for r in res["energy"]}
    up, down = np.array(cases["B=V"]["logE"]), np.array(cases["B=-V"]["logE"])
    assert cases["B=V"]["monotone"] and cases["B=-V"]["monotone"]
    assert np.all(np.diff(up) >= 0) and up[-1] > up[0]
    assert np.all(np.diff(down) <= 0) and down[-1] < down[0]
    assert (tmp_path / "results_quick.md").exists()


@pytest.mark.slow
def test_fig3_quick_maps_and_animation(tmp_path, monkeypatch):
    monkeypatch.setattr(fig3, "HERE", tmp_path)
    res = fig3.main(["--quick"])
    d = res["density"]
    assert d["align_E"][-1] > 0.9 and d["align_F"][-1] < 0.05  # E first at beta = 100
    assert res["mass_drift"] < 1e-12 and res["min_density"] > 0
    for name in ("maps_quick.png", "alignment_quick.png", "animation_quick.gif", "results_quick.md",
                 "results_quick.json", "density_n6_quick.nc"):
        assert (tmp_path / name).exists()
