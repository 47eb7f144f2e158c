"""The reduced cluster dynamics study (validation/cluster_dynamics, issue #17 item 2) in its quick mode: the
antipodal reduction equals the two-particle system, the closed-form Jacobians at +-e1 and on the stall cone
equal the numerical ones, and the stall is left at the predicted rate (seconds: ODEs only)."""
from __future__ import annotations

import importlib
import math
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validation import criteria as C  # noqa: E402


@pytest.mark.slow  # a study run (12-19 s): out of the default run, which must stay under 10 minutes
def test_cluster_dynamics_quick_mode_passes_its_criteria(tmp_path, monkeypatch):
    mod = C.load_study("cluster_dynamics")
    monkeypatch.setattr(mod, "HERE", tmp_path)
    assert mod.main(["--quick"]) == 0
    res = json.loads((tmp_path / "results_quick.json").read_text())
    crits = mod.criteria(res)
    assert len(crits) == 21 and all(c["pass"] for c in crits), [c for c in crits if not c["pass"]]
    # the stall is left by the translation along e2 at rate 1 for every beta
    assert all(c["mode"].startswith("translation") and abs(c["most_unstable"] - 1.0) < 1e-6 for c in res["cone"])



def test_token_ensembles_quick_mode_reproduces_fig4_tokens(tmp_path, monkeypatch):
    """validation/token_ensembles (issue #17 item 4) in its quick mode (n = 100 and 200, 3 seeds, T = 20, a
    few seconds): every run enters the E-phase, and the 200-token runs give fig4_concentration's
    200-token t_EF and t_exit for the same seeds (the same Algorithm 1 run by another script, to 1e-9)."""
    mod = C.load_study("token_ensembles")
    monkeypatch.setattr(mod, "HERE", tmp_path)  # outputs and run cache; FIG4 still reads the committed runs
    assert mod.main(["--quick"]) == 0
    res = json.loads((tmp_path / "results_quick.json").read_text())
    crits = mod.criteria(res)
    assert len(crits) == 3 and all(c["pass"] for c in crits), crits
    assert res["fig4_match"] is not None and res["fig4_match"] <= 1e-9
    assert [p["n"] for p in res["per_n"]] == [100, 200] and all(p["seeds"] == 3 for p in res["per_n"])


def test_token_ensembles_large_runs_go_in_chunks_and_resume(tmp_path, monkeypatch):
    """The runs of n >= CHUNKED_FROM tokens (the n = 1e5 ones, an hour or more each) write their state after
    every chunk and resume from it: a run killed after its first chunk, run again, gives the record of
    a run never killed (the same chunks, so to the last bit), and the alignments cover every saved time."""
    mod = C.load_study("token_ensembles")
    monkeypatch.setattr(mod, "CHUNKED_FROM", 50)
    monkeypatch.setattr(mod, "CHUNK", 0.5)
    whole = mod.one_run(60, 1, 1.0, tmp_path / "a", tol=1e-10)
    assert len(whole["align_E"]) == len(whole["times"]) == 5 and whole["tol"] == 1e-10

    real, calls = mod.simulate_particles, []

    def dies_second_time(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed during the second chunk
        return real(*a, **k)

    monkeypatch.setattr(mod, "simulate_particles", dies_second_time)
    with pytest.raises(KeyboardInterrupt):
        mod.one_run(60, 1, 1.0, tmp_path / "b", tol=1e-10)
    part = tmp_path / "b" / "n60_s1_T1_tol1e-10.part.nc"
    import xarray as xr

    with xr.open_dataset(part) as ds:  # a NetCDF file any reader opens
        assert float(ds["t"]) == 0.5 and ds["x"].shape == (60, 3)
    rerun = []

    def counted(*a, **k):
        rerun.append(1)
        return real(*a, **k)

    monkeypatch.setattr(mod, "simulate_particles", counted)
    again = mod.one_run(60, 1, 1.0, tmp_path / "b", tol=1e-10)
    assert len(rerun) == 1  # only the second chunk is run again
    assert again["align_E"] == whole["align_E"] and again["align_F"] == whole["align_F"]


def test_transition_law_fit_and_criteria():
    """validation/transition_law (issue #17 item 3), its analysis on synthetic times (no run): the fit
    t = a + b log(1/eps) recovers a and b over the finite times and skips the runs that never left E, and
    the criteria pass on the two-cluster law (b = 1, every run leaving E) and fail when a run stays on E
    or the slope is 3x (what nside 32 measured: b = 3.69)."""
    import numpy as np

    mod = C.load_study("transition_law")
    eps = np.array([1e-1, 1e-2, 1e-3, 1e-4, 1e-5])
    t = 2.0 + 1.0 * np.log(1 / eps)
    f = mod.fit(eps, np.where(eps < 1e-4, np.nan, t))
    assert f["points"] == 4 and abs(f["a"] - 2.0) < 1e-12 and abs(f["b"] - 1.0) < 1e-12
    assert mod.fit(eps[:2], t[:2]) is None  # fewer than three points: no fit

    def res_of(times):
        rows = [{"nside": 32, "eps": e, "t_exit": x, "mass_drift": 1e-16, "min": 1e-30} for e, x in zip(eps, times)]
        return {"rows": rows, "fits": {"nside 32 t_exit": mod.fit(eps, times)}, "b_predicted": 1.0, "quick": False}

    assert all(c["pass"] for c in mod.criteria(res_of(t)))
    stays = mod.criteria(res_of(np.where(eps < 1e-3, np.nan, t)))
    assert [c["pass"] for c in stays] == [True, True, False, True]
    steep = mod.criteria(res_of(2.0 + 3.0 * np.log(1 / eps)))
    assert [c["pass"] for c in steep] == [True, True, True, False]


def test_transition_law_other_beta_is_its_own_sweep():
    """``--beta 100``: every member of both sweeps (nside 16/32 and 64) runs at that beta under a sweep name
    of its own (so its run directories and cache entries never mix with beta 30's), and the outputs are
    the tagged results_beta100.* (the criteria CLI finds that JSON); beta 30 keeps the plain names."""
    mod = C.load_study("transition_law")
    base = mod.specs(False, True)
    hot = mod.specs(False, True, 100.0)
    assert [s.name for s in hot] == [s.name + "_beta100" for s in base]
    for s30, s100 in zip(base, hot):
        m30, m100 = s30.members(), s100.members()
        assert len(m100) == len(m30) > 0
        assert {m.config.model.beta for m in m100} == {100.0} and {m.config.model.beta for m in m30} == {30.0}
        # the same grids and amplitudes: only beta differs
        assert sorted((m.config.grid.nside, m.config.initial.eps) for m in m100) == \
            sorted((m.config.grid.nside, m.config.initial.eps) for m in m30)
    assert mod.results_for(["--beta", "100"]).name == "results_beta100.json"
    assert mod.results_for([]).name == "results.json"


def test_fig4_ladder_csv_is_the_contract_and_matches_the_runs(tmp_path):
    """validation/fig4_concentration/ladder.csv (issue #17 item 1), read as external checks read it (pandas
    and the csv module): exactly the issue's columns in its order; one ladder per setting: the adaptive
    ladders of adaptive.json for the perturbed f0 at beta 30 (default refinement) and 100 (the attended one on
    nside 32 cells, the fallback) and those of adaptive_uniform.json for the uniform
    f0 at beta 30 and 100, and zero_temperature.json's for both f0 at beta = inf (values over t <= 20, as their records give them), the study's uniform-grid runs to T = 20
    (results.json) for every other setting; empty (NaN) where a time does
    not occur by T, each value equal to its run's; the file on disk is what the study writes now (not
    stale); eps is the amplitude the sweeps' base config gives the perturbed f0; the uniform ladders'
    status between their two finest levels is what the README reports (t_exit moves 30 % and 29 % from
    nside 32 to 64 at beta 30 and 100: not converged)."""
    import csv
    import json

    import numpy as np
    import pandas as pd

    from spherepde.sweeps import load_sweep

    mod = C.load_study("fig4_concentration")
    here = C.VALID / "fig4_concentration"
    recs = json.loads((here / "results.json").read_text())["runs"]
    ada = mod.adaptive_rows()
    on_ada = {(a.get("f0", "perturbed"), a["beta"]) for a in ada}
    inf = float("inf")
    assert on_ada == {("perturbed", 30.0), ("perturbed", 100.0), ("perturbed", 300.0), ("perturbed", 1000.0),
                      ("uniform", 30.0), ("uniform", 100.0), ("perturbed", inf), ("uniform", inf)}
    assert all(sum((a.get("f0", "perturbed"), a["beta"]) == k for a in ada) >= 2 for k in on_ada)
    # beta 100's, 300's and 1000's perturbed ladders are fallback ones (no ladder of the default refinement
    # there): the one with the attention criterion where f varies on nside 32 coarsest cells, to nside_max 512
    # at beta 100 (converged: README), 1024 at beta 300 and 2048 at beta 1000 (512 to 2048 to T = 12); beta 300's
    # nside_min 64 level, beta 1000's nside_min 16 one and beta 100's rtol 1e-4 level are not in them
    for beta, levels in ((100.0, [64, 128, 256, 512]), (300.0, [64, 128, 256, 512, 1024]),
                         (1000.0, [64, 128, 256, 512, 1024, 2048])):
        sel = [a for a in ada if (a.get("f0", "perturbed"), a["beta"]) == ("perturbed", beta)]
        assert [a["nside_max"] for a in sel] == levels
        assert all(a.get("attended") and a["nside_min"] == 32 and a["attention_variation"] == 0.25 for a in sel)
    # beta = inf, both f0: zero_temperature.py's ladder on the default coarsest cells and step (its variants in
    # nside_min and rtol are not in it); no exit and no t_EF at any level (the exact solution has neither), and
    # the plateau the finest cell's: it halves per level
    for f0 in ("perturbed", "uniform"):
        sel = [a for a in ada if (a.get("f0", "perturbed"), a["beta"]) == (f0, inf)]
        assert [a["nside_max"] for a in sel] == [64, 128, 256, 512]
        assert all(a["nside_min"] == 16 and not a.get("rtol") for a in sel)
        assert all(a["t_exit_20"] is None and a["t_EF_20"] is None for a in sel)
        assert all(1.9 < x["plateau_w2"] / y["plateau_w2"] < 2.1 for x, y in zip(sel, sel[1:]))
    with open(here / "ladder.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert tuple(header) == mod.LADDER_COLUMNS == ("beta", "f0", "eps", "nside_max", "t_exit", "t_EF",
                                                   "plateau_w2", "max_cells", "wall_s")
    df = pd.read_csv(here / "ladder.csv")
    # both f0 at beta 30 and at beta 100, and the perturbed f0 at beta 300 and 1000, have an adaptive ladder
    replaced = [r for r in recs if (r["f0"], float(r["beta"])) in on_ada]
    assert len(replaced) == 26 and len(df) == len(recs) - len(replaced) + len(ada)
    by_key = {(r["f0"], str(r["beta"]), r["nside"]): r for r in recs}
    by_level = {(a.get("f0", "perturbed"), f"{a['beta']:g}", a["nside_max"]): a for a in ada}
    n_ada = 0
    for row in df.itertuples():
        beta = "inf" if np.isinf(row.beta) else f"{row.beta:g}"
        if (row.f0, beta, row.nside_max) in by_level:
            a = by_level[(row.f0, beta, row.nside_max)]
            n_ada += 1
            pairs = (("t_exit", a["t_exit_20"]), ("t_EF", a["t_EF_20"]), ("plateau_w2", a["plateau_w2"]))
            assert row.max_cells == a["max_cells"] <= 12 * row.nside_max ** 2 and abs(row.wall_s - a["wall_s"]) <= 0.05
        else:
            r = by_key[(row.f0, beta, row.nside_max)]
            pairs = (("t_exit", r["t_exit"]), ("t_EF", r["t_EF"]), ("plateau_w2", r["min_W2"]))
            assert row.max_cells == 12 * row.nside_max ** 2 and abs(row.wall_s - r["wall_s"]) <= 0.05
        for col, want in pairs:
            val = getattr(row, col)
            if want is None or not np.isfinite(want):
                assert np.isnan(val), (row, col)
            else:
                assert abs(val - want) <= 1e-5 * abs(want), (row, col)  # written to 6 significant digits
        assert row.eps == (mod.EPS if row.f0 == "perturbed" else 0.0)
    assert n_ada == len(ada)
    out = tmp_path / "ladder.csv"
    mod.write_ladder(recs, out, ada)
    assert out.read_text() == (here / "ladder.csv").read_text()
    member = next(m for m in load_sweep(here / "sweeps" / "main.toml").members()
                  if m.config.initial.type == "perturbed_uniform")
    assert member.config.initial.eps == mod.EPS
    status = {(s["f0"], s["beta"]): s for s in mod.ladder_status(recs)}
    for beta, rel in (("30", 0.300), ("100", 0.289)):
        s = status[("perturbed", beta)]
        assert s["levels"] == [32, 64] and abs(s["t_exit"] - rel) < 5e-4 and s["t_exit"] > 0.02


def test_one_cell_capture_is_a_steady_state_of_the_scheme():
    """The diagnosis of validation/transition_law/capture.py on a state built for it (HEALPix nside 8, paper
    matrices, beta 30): half the mass in the cell whose south vertex is e1 (centre at z = 2 / (3 nside)) and
    half in its antipode. The field of that state drives the cell's points to w / |w|, w = V m(c), which the
    paper's V (eigenvalue ratio 2 on e3 : e1) puts on the cell's north vertex, z = 4 / (3 nside): the faces
    see almost no outflow (measured 1.3e-5 of the normal velocity at nside 16), and the solver keeps the
    mass in the two cells to 1e-3 over t = 5 (measured: all of it), the documented limitation (user guide,
    "Known limitations"). The same two clusters two rings further from +-e1 (centre z = 3 dz) are not held:
    their cell's outward fraction is 0.31 (10^3 times the captured one's bound) and the solver empties the
    cells (measured 1.7e-33 of the mass left in them at t = 5)."""
    import healpy as hp
    import numpy as np

    import spherepde as sp
    from validation.transition_law import capture as cap

    B, V = np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0])
    nside = 8
    g = sp.HealpixGrid(nside)
    dz = 2.0 / (3 * nside)

    def two_cells(z):
        c = np.array([np.sqrt(1 - z * z), 0.0, z])
        i, j = hp.vec2pix(nside, *c), hp.vec2pix(nside, *(-c))
        f = np.zeros(g.n_cells)
        f[[i, j]] = 0.5 / g.areas[[i, j]]
        return f, (i, j)

    f, cells = two_cells(dz)
    d = cap.capture_state(g, f, 30.0)
    assert d["top_two_share"] == 1.0 and np.allclose(d["top_angles_cells"], 0.65, atol=0.01)
    # -V c = (c1, -c2, 2 c3) puts the attractor at z = 2 dz / sqrt(1 + 3 dz^2), the vertex at 2 dz: 3 dz^3
    # apart, 0.014 cells at nside 8 (measured 0.012), 0.0034 at nside 16 (capture.md: 0.003)
    assert d["outward_fraction"] < 1e-4 and d["attractor_to_nearest_vertex_cells"] < 0.02
    r = sp.solve(g, sp.Attention(B, V, 30.0), f, 5.0, save_at=[0.0, 5.0])
    held = (r.density[-1] * g.areas)[list(cells)].sum()
    assert held > 0.999, held
    f2, cells2 = two_cells(3 * dz)  # two rings up the same meridian: its attractor is outside it
    d2 = cap.capture_state(g, f2, 30.0)
    assert d2["outward_fraction"] > 1e3 * d["outward_fraction"]
    r2 = sp.solve(g, sp.Attention(B, V, 30.0), f2, 5.0, save_at=[0.0, 5.0])
    assert (r2.density[-1] * g.areas)[list(cells2)].sum() < 0.9


def test_transition_law_adaptive_levels_are_sweeps_of_their_own():
    """validation/transition_law/adaptive.py: each finest level is its own sweep (64 keeps the first
    name, so its finished members stay valid when a level is added), on AdaptiveHealpixGrid(16, level)
    with f0 as cell averages (what an adaptive grid takes), the study's beta, T and f0 otherwise, and the
    two amplitudes that uniform nside 16 and 32 capture."""
    from validation.transition_law import adaptive as mod
    names = {n: mod.spec(n).name for n in (64, 128, 256)}
    assert names == {64: "transition_law_adaptive", 128: "transition_law_adaptive_128",
                     256: "transition_law_adaptive_256"}
    for n in (64, 256):
        ms = mod.spec(n).members()
        assert sorted(m.config.initial.eps for m in ms) == [1e-4, 1e-3]
        for m in ms:
            g, c = m.config.grid, m.config
            assert (g.type, g.nside_min, g.nside_max) == ("adaptive", 16, n)
            # sample None is the default, "average" (kept out of the record so that older hashes hold)
            assert c.initial.sample is None and c.model.beta == 30.0 and c.time.t_end == 35.0


def test_fig4_adaptive_attention_variation_and_t_end_are_ladders_and_sweeps_of_their_own():
    """validation/fig4_concentration/adaptive.py --attention-variation / --t-end: a level with the attention
    criterion confined to where f varies is its own sweep (``_av<a>``) whose grid carries
    Refinement(attention_variation=a), and a level run to another T its own (``_T<T>``) with that t_end; the
    ladders keep the refinements apart (an av level never enters the default or attended ladder), and the
    report names a level's T and judges t_EF "by T" at the earlier T of a pair."""
    from validation.fig4_concentration import adaptive as A

    sp_ = A.spec(100.0, 512, 32, True, None, "perturbed", 0.25, 12.0)
    assert sp_.name == "fig4_adaptive_b100_512_min32_att_av0.25_T12"
    (m,) = sp_.members()
    ref = m.config.build_grid().refinement
    assert ref.attention_variation == 0.25 and ref.attended and m.config.time.t_end == 12.0
    assert A.spec(100.0, 512, 32, True).name == "fig4_adaptive_b100_512_min32_att"  # the old names stand
    assert A.spec(100.0, 512, 32, True).members()[0].config.build_grid().refinement.attention_variation == 0.0

    def rec(n, av, t_end=A.T_END, t_exit=8.0):
        return {"beta": 100.0, "nside_max": n, "nside_min": 32, "attended": True, "attended_floor": None,
                "attention_variation": av, "t_end": t_end, "t_exit": t_exit, "t_EF": None, "plateau_w2": 0.02,
                "times": [0.0, 1.0], "align_E": [0.3, 0.9], "align_F": [0.3, 0.0], "align_Fabs": [0.4, 0.1]}

    recs = [rec(64, 0.0), rec(128, 0.0), rec(64, 0.25, t_exit=10.0), rec(128, 0.25, t_exit=8.1),
            rec(512, 0.25, 12.0, t_exit=8.0)]
    assert [r["nside_max"] for r in A.ladder(recs, attended=True, nside_min=32)] == [64, 128]
    av = A.ladder(recs, attended=True, attention_variation=0.25, nside_min=32)
    assert [r["nside_max"] for r in av] == [64, 128, 512]
    ch = A.changes(av)
    assert ch[1]["t_end"] == 12.0 and A.verdict(ch[1]).endswith("reached by T = 12 at neither level")
    assert ch[0]["t_end"] == A.T_END
    # neither level leaves E by T (beta 1000): the verdict is the plateau's alone, and says why
    none = A.changes([rec(128, 0.25, t_exit=None), dict(rec(256, 0.25, t_exit=None), plateau_w2=0.0205)])[0]
    assert A.verdict(none) == "the plateau: yes; t_exit and t_EF: reached by T = 30 at neither level"
    far = A.changes([rec(128, 0.25, t_exit=None), dict(rec(256, 0.25, t_exit=None), plateau_w2=0.03)])[0]
    assert A.verdict(far).startswith("the plateau: no;")
    assert A._t_end_note(av[2]) == " (T = 12)" and A._t_end_note(av[1]) == ""
    assert A.refinement_name(*A.refinement_of(av[0])) == "attended, attention where f varies > 0.25"
    assert A.refinement_of({"beta": 30.0, "nside_max": 64}) == (False, None, 0.0)  # records from before


def _fig4_rec(n, rtol=None, t_exit=8.0, plateau=0.02, steps=1000, beta=100.0):
    """A record of fig4_concentration/adaptive.py with the fields its report reads (made-up values)."""
    return {"beta": beta, "nside_max": n, "nside_min": 32, "attended": True, "attended_floor": None,
            "attention_variation": 0.25, "t_end": 12.0, "rtol": rtol, "t_exit": t_exit, "t_EF": None,
            "plateau_w2": plateau, "argmin_w2": 5.0, "steps": steps, "wall_s": 10.0 * steps / 1000,
            "times": [0.0, 1.0], "align_E": [0.3, 0.9], "align_F": [0.3, 0.0], "align_Fabs": [0.4, 0.1],
            "W2": [0.1, 0.02], "cells": [10, 10], "max_cells": 10, "cells_T": 10, "mass_drift": 0.0,
            "min_f": 0.0}


def test_fig4_adaptive_departure_from_the_plateau_is_read_apart_from_the_exit():
    """adaptive.py leave_plateau: the time align E falls back below 0.99 after exceeding it (linear between
    saved states), which at beta 300 comes long before t_exit because align E stalls at ~0.93 above the exit's
    0.9; None while E stays on its plateau; and its change between levels sits in the changes table."""
    from validation.fig4_concentration import adaptive as A

    t = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    stall = {"times": t, "align_E": [0.33, 0.98, 1.0, 0.98, 0.93, 0.92]}  # 1.0 -> 0.98 crosses 0.99 at t = 5
    assert A.leave_plateau(stall) == pytest.approx(5.0)
    assert A.leave_plateau({"times": t, "align_E": [0.33, 0.98, 1.0, 1.0, 0.999, 0.995]}) is None
    flat = {"align_F": [0.3] + [0.0] * 5, "align_Fabs": [0.3] + [0.05] * 5, "W2": [1.0] + [0.02] * 5}
    a = {**_fig4_rec(64), **stall, **flat}
    b = {**_fig4_rec(128), **flat, "times": t, "align_E": [0.33, 0.98, 1.0, 0.96, 0.93, 0.92]}  # crosses at 4.5
    (c,) = A.changes([a, b])
    assert c["t_leave"] == pytest.approx(abs(4.5 - 5.0) / 4.5)


def test_fig4_adaptive_rows_of_concurrent_runs_are_merged_not_overwritten(tmp_path):
    """adaptive.py merge_rows: a run that read adaptive.json before another run added its rows keeps them when
    it adds its own (the read, merge and write are one locked step; before, each run wrote back the file as
    it had read it at its start, and rows were lost when two levels ran at once); a row of the same key is
    replaced, and adaptive.md follows the file."""
    from validation.fig4_concentration import adaptive as A

    assert A.merge_rows([], tmp_path) == [] and not (tmp_path / "adaptive.json").exists()
    first = A.merge_rows([_fig4_rec(64)], tmp_path)  # run 1 starts, and has seen one row
    A.merge_rows([_fig4_rec(128, beta=300.0)], tmp_path)  # run 2 adds its row meanwhile
    rows = A.merge_rows([_fig4_rec(128)], tmp_path)  # run 1 adds its next row
    assert len(first) == 1 and sorted((r["beta"], r["nside_max"]) for r in rows) == [(100.0, 64), (100.0, 128),
                                                                                      (300.0, 128)]
    rows = A.merge_rows([_fig4_rec(128, t_exit=7.5)], tmp_path)  # a level rerun replaces its row
    assert len(rows) == 3 and [r["t_exit"] for r in rows if r["nside_max"] == 128 and r["beta"] == 100.0] == [7.5]
    on_disk = json.loads((tmp_path / "adaptive.json").read_text())["rows"]
    assert on_disk == rows and (tmp_path / "adaptive.md").read_text() == A.report(rows)


def test_record_files_hold_the_lock_across_processes(tmp_path):
    """validation/records.py (the record files of fig4_concentration/adaptive.py, log_tails.py, lagrangian.py
    and adaptive_clusters/run.py): a second process's upsert waits while this one holds the lock for its
    read-merge-write, so neither row is lost. This process reads the file, waits 0.6 s and writes back what it
    read plus its row: were the child not blocked, its row (written during the wait) would be overwritten.
    The write leaves no temporary file."""
    import subprocess
    import time

    from validation.records import locked, upsert, write_atomic

    path = tmp_path / "rows.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from validation.records import upsert; "
            "upsert(sys.argv[2], {'k': 2}, lambda r: r['k'])")
    with locked(path):
        rows = json.loads(path.read_text()) if path.exists() else []
        child = subprocess.Popen([sys.executable, "-c", code, str(C.VALID.parent), str(path)])
        time.sleep(0.6)  # a Python start and an upsert take ~0.1 s on this machine: the child is at the lock
        assert child.poll() is None and not path.exists()  # blocked, nothing written
        write_atomic(path, json.dumps(rows + [{"k": 1}]))
    assert child.wait(timeout=60) == 0
    assert json.loads(path.read_text()) == [{"k": 1}, {"k": 2}]
    upsert(path, {"k": 1, "v": "again"}, lambda r: r["k"])  # a row of the same key replaced, sorted by key
    assert json.loads(path.read_text()) == [{"k": 1, "v": "again"}, {"k": 2}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json", "rows.json.lock"]


def test_fig4_beta300_exit_lies_on_the_tails_drift_on_disk():
    """adaptive.json (README, "beta 300"): on the nside_max ladder 64 to 1024 (nside 32 coarsest cells) the
    departure from E's plateau converges (its steps shrink, to below 5 % at 512 and 2 % at 1024) while t_exit,
    read where align E crosses 0.9 on the slow drift that follows, agrees to 0.5 % at every step; the plateau
    converges at the last step (8.3 % and then below its 5 % bar), so the ladder's last two levels meet the bar
    in t_exit and the plateau. Finer coarsest cells (nside 64, nside_max 128) move that t_exit by more than the
    2 % bar and the departure by under 1 %: the exit is the tails' reading; nside_min 128 moves it back (not
    converged in nside_min)."""
    import json

    from validation.fig4_concentration import adaptive as A

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive.json").read_text())
    lad = A.fallback_ladder(d["rows"], 300.0)  # Figure 4's ladder at this beta (attended, nside 32 base cells)
    assert [r["nside_max"] for r in lad] == [64, 128, 256, 512, 1024] and A.refinement_of(lad[0])[2] == 0.25
    ch = A.changes(lad)
    leave = [c["t_leave"] for c in ch]
    assert leave[0] > leave[1] > leave[2] > leave[3] and leave[3] < 0.02 and leave[2] < 0.05 < leave[1]
    assert all(c["t_exit"] < 0.005 for c in ch)
    assert ch[-2]["plateau_w2"] > A.BAR["plateau_w2"] > ch[-1]["plateau_w2"]  # 8.3 %, then 1.6 %
    assert ch[-1]["t_exit"] <= A.BAR["t_exit"]
    assert all(A.leave_plateau(r) < r["t_exit"] - 4.0 for r in lad)  # the exit comes long after the departure
    tails = [r for r in d["rows"] if r["beta"] == 300.0 and r["nside_min"] == 64 and r["nside_max"] == 128]
    (c,) = A.changes([next(r for r in lad if r["nside_max"] == 128), *tails], by="nside_min")
    assert c["t_exit"] > A.BAR["t_exit"] and c["t_leave"] < 0.01
    # the nside_min ladder at nside_max 128 (32, 64, 128: the last the uniform nside 128 grid): the exit moves by
    # more than the bar at both steps, back and forth (16.34, 16.86, 16.39), the departure by under 1 %, and the
    # tails' share of the attention at T falls at each step (0.62, 0.50, 0.18)
    mins = sorted((r for r in d["rows"] if r["beta"] == 300.0 and r["nside_max"] == 128 and not r.get("rtol")
                   and r.get("attention_variation") == 0.25), key=lambda r: r["nside_min"])
    assert [r["nside_min"] for r in mins] == [32, 64, 128]
    ch = A.changes(mins, by="nside_min")
    assert all(c["t_exit"] > A.BAR["t_exit"] and c["t_leave"] < 0.01 for c in ch)
    assert (mins[1]["t_exit"] - mins[0]["t_exit"]) * (mins[2]["t_exit"] - mins[1]["t_exit"]) < 0
    assert abs(mins[2]["t_exit"] / mins[0]["t_exit"] - 1.0) < 0.005
    assert mins[0]["tail_share_T"] > mins[1]["tail_share_T"] > mins[2]["tail_share_T"]
    # the step-size pair (README "beta 300", measured 2026-12-06): rtol 1e-4 at nside_max 128 moves the exit by
    # 7e-4 and the plateau by 4.6e-3, below the bars and far below the exit's 3 % along nside_min: what moves the
    # exit there is the tails, not the step
    (p,) = [p for p in A.step_pairs(d["rows"]) if p["beta"] == 300.0]
    assert p["nside_max"] == 128 and p["rtol"] == 1e-4 and p["steps"][1] > 2 * p["steps"][0]
    assert p["t_exit"] < 3e-3 and 10 * p["t_exit"] < ch[0]["t_exit"] and p["plateau_w2"] < 1e-2 and p["t_EF"] is None


def test_fig4_adaptive_rtol_is_a_step_size_ladder_never_a_resolution_level():
    """validation/fig4_concentration/adaptive.py --rtol: a level at another error-control tolerance is its own
    sweep (``_rtol1e-04``) whose configuration carries that rtol; it never enters a resolution ladder (ladder,
    ladders, hence ladder.csv and adaptive.png), and the report pairs it with the same level at the default
    tolerance: the relative changes measured against the tighter tolerance's values, and the steps."""
    from validation.fig4_concentration import adaptive as A

    sp_ = A.spec(100.0, 128, 32, True, None, "perturbed", 0.25, 12.0, 1e-4)
    assert sp_.name == "fig4_adaptive_b100_128_min32_att_av0.25_T12_rtol1e-04"
    assert sp_.members()[0].config.scheme.rtol == 1e-4
    assert A.spec(100.0, 128, 32, True, None, "perturbed", 0.25, 12.0).members()[0].config.scheme.rtol == 1e-3

    rec = _fig4_rec
    recs = [rec(64), rec(128), rec(128, 1e-4, t_exit=8.08, plateau=0.0201, steps=2800)]
    assert len({A.key(r) for r in recs}) == 3  # both 128 levels kept side by side in adaptive.json
    lad = A.ladder(recs, attended=True, attention_variation=0.25, nside_min=32)
    assert [(r["nside_max"], r["rtol"]) for r in lad] == [(64, None), (128, None)]
    assert all(len(v) == 2 for v in A.ladders(recs, "nside_max").values())
    assert A.fallback_ladder(recs, 100.0) == lad
    (p,) = A.step_pairs(recs)
    assert p["nside_max"] == 128 and p["steps"] == (1000, 2800)
    assert p["t_exit"] == pytest.approx(0.08 / 8.08) and p["plateau_w2"] == pytest.approx(1e-4 / 0.0201)
    assert p["t_EF"] is None and A._pair(p, "t_EF") == "none by T at both"
    text = A.report(recs)
    assert "The step-size ladder" in text and "0.001 -> 0.0001" in text and "8.0000 -> 8.0800 (9.9e-03)" in text
    assert A._t_end_note(recs[2]) == " (T = 12) (rtol 0.0001)"
    # a level at another T than its default-tolerance twin is no pair
    assert A.step_pairs([rec(128), {**rec(128, 1e-4), "t_end": 20.0}]) == []


def test_fig4_beta100_ladder_on_disk_converges_with_the_attention_criterion_where_f_varies():
    """adaptive.json (README, "beta 100 converged"): the perturbed f0 at beta 100 on the attended refinement
    with the attention criterion where f varies by > 0.25 (nside 32 coarsest cells) has the levels 64 to 512,
    whose last step meets the issue's bar in t_exit (2 %) and the plateau (5 %), with steps shrinking
    level by level; at nside_max 64 and 128 the criterion everywhere, where f varies > 0.1 and > 0.25 give the
    same exit to 2e-4 and plateau to 2e-3, while the 0.25 level holds fewer cells (the start)."""
    import json

    from validation.fig4_concentration import adaptive as A

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive.json").read_text())
    lad = [r for r in A.ladder(d["rows"], attended=True, attention_variation=0.25, nside_min=32) if r["beta"] == 100.0]
    assert [r["nside_max"] for r in lad] == [64, 128, 256, 512]
    ch = A.changes(lad)
    assert ch[-1]["t_exit"] <= A.BAR["t_exit"] and ch[-1]["plateau_w2"] <= A.BAR["plateau_w2"]
    assert A.verdict(ch[-1]).startswith("t_exit and the plateau: yes")
    steps = [c["t_exit"] for c in ch]
    assert steps[0] > steps[1] > steps[2] and all(c["t_exit"] > A.BAR["t_exit"] for c in ch[:-1])
    assert A.fallback_ladder(d["rows"], 100.0) == lad
    for n in (64, 128):
        same = {A.refinement_of(r)[2]: r for r in d["rows"] if r["beta"] == 100.0 and r["nside_max"] == n
                and r.get("nside_min") == 32 and r.get("attended") and not r.get("rtol")}
        assert {0.0, 0.25} <= set(same) and (n == 128 or 0.1 in same)
        for r in same.values():
            assert abs(r["t_exit"] - same[0.0]["t_exit"]) <= 2e-4 * same[0.0]["t_exit"]
            assert abs(r["plateau_w2"] - same[0.0]["plateau_w2"]) <= 2e-3 * same[0.0]["plateau_w2"]
        assert same[0.25]["max_cells"] < same[0.0]["max_cells"]
    # the step-size ladder (README, "And in the step size"): the 128 level at rtol 1e-4 moves t_exit and the
    # plateau by well under the bars between resolution levels, and under the last resolution step
    # beta 30 (README "And in the step size", 2026-12-06): the same at its default-refinement 128 level, T = 30
    (q,) = [p for p in A.step_pairs(d["rows"]) if p["beta"] == 30.0]
    assert q["nside_max"] == 128 and q["rtol"] == 1e-4 and q["steps"][1] > 2 * q["steps"][0]
    assert q["t_exit"] < 1e-3 and q["plateau_w2"] < 2e-3
    (p,) = [p for p in A.step_pairs(d["rows"]) if p["beta"] == 100.0]
    assert p["nside_max"] == 128 and p["rtol"] == 1e-4 and p["steps"][1] > 2.5 * p["steps"][0]
    assert p["t_exit"] < 3e-3 < ch[-1]["t_exit"] and p["plateau_w2"] < 1e-2 and p["t_EF"] is None


def test_fig4_adaptive_ladder_measures_its_runs(tmp_path, monkeypatch):
    """validation/fig4_concentration/adaptive.py end to end on a ladder small enough for the test run
    (AdaptiveHealpixGrid(4, 8), beta 30, T = 1, through a real sweep on a local Dask cluster): the record's
    alignments at every saved time are those of the results file's own cells (spherepde.alignment, computed
    here from the loaded frames), the plateau is the smallest W2 over the window, the cell counts are the
    frames' sizes, mass is exact to round-off and the density non-negative; and the ladder.csv rows that
    run.py writes for this record carry its t <= 20 times, plateau and cell count (a record whose
    t_exit_20 is set shows up, one whose setting has an adaptive ladder replaces the uniform rows)."""
    import numpy as np

    import spherepde as sp
    from validation.fig4_concentration import adaptive as A

    monkeypatch.setattr(A, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(A, "OUT", tmp_path)
    monkeypatch.setattr(A, "NSIDE_MIN", 4)
    monkeypatch.setattr(A, "T_END", 1.0)
    monkeypatch.setattr(A, "T_FIG4", 1.0)
    rec = A.member(30.0, 8)
    files = list((tmp_path / "runs").glob("*/members/*/results.h5"))
    assert len(files) == 1
    r = sp.load(files[0])
    spd = sp.spectral_data(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]))
    assert len(rec["times"]) == len(r.times) == 5  # saved every 0.25
    for i in range(len(r.times)):
        g = r.grid_at(i)
        w = np.asarray(r.density[i]) * g.areas
        assert abs(rec["align_E"][i] - sp.alignment(g.centers, w, spd.E)) <= 1e-14
        assert abs(rec["align_F"][i] - sp.alignment(g.centers, w, spd.F)) <= 1e-14
        assert rec["cells"][i] == g.n_cells
    assert rec["plateau_w2"] == min(rec["W2"]) and 0.0 < rec["plateau_w2"] < 1.0
    assert rec["max_cells"] == max(rec["cells"]) > 12 * 4 ** 2  # it refined beyond nside_min
    assert rec["mass_drift"] <= 1e-13 and rec["min_f"] >= 0.0
    run = C.load_study("fig4_concentration")
    fake = dict(rec, t_exit_20=0.75, t_EF_20=None)
    uniform = [{"f0": "perturbed", "beta": "30", "nside": 8, "t_exit": None, "t_EF": None, "min_W2": 0.1,
                "wall_s": 1.0},
               {"f0": "perturbed", "beta": "100", "nside": 8, "t_exit": None, "t_EF": None, "min_W2": 0.1,
                "wall_s": 1.0}]
    rows = run.ladder_rows(uniform, [fake])
    assert [(x["beta"], x["nside_max"]) for x in rows] == [("30", "8"), ("100", "8")]
    a = rows[0]
    assert a["t_exit"] == "0.75" and a["t_EF"] == "" and a["max_cells"] == str(rec["max_cells"])
    assert float(a["plateau_w2"]) == pytest.approx(rec["plateau_w2"], rel=1e-5)
    assert rows[1]["max_cells"] == str(12 * 64)  # beta 100 has no adaptive ladder: its uniform row stays


def test_fig4_adaptive_ladder_on_disk_converges_in_t_exit():
    """validation/fig4_concentration/adaptive.json (the committed adaptive ladder, beta 30, perturbed f0):
    each record's times are those of its own alignment series (diagnostics.exit_time / transition_time over
    the whole run and over t <= 20, recomputed here), its plateau the smallest W2 over t <= 20; mass exact to
    round-off and f >= 0 on every level; and the README's reading: t_exit and the plateau W2 meet the
    issue's bar (2 %, 5 %) between the two finest levels (measured 0.3 % and 0.1 % between nside_max 256
    and 512) and t_exit falls monotonically to its limit (7.85, 7.22, 7.08, 7.06), while the terminal phase
    does not converge: F overtakes E by T = 30 at the finest level only, and on every level once the coarsest
    cells (where the tails live) are refined from nside 16 to 32, while t_exit does not move."""
    import json

    import numpy as np

    from spherepde.diagnostics import exit_time, transition_time
    from validation.fig4_concentration import adaptive as A

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive.json").read_text())
    recs = A.ladder(d["rows"])
    assert [r["nside_max"] for r in recs] == [64, 128, 256, 512] and {r["beta"] for r in recs} == {30.0}
    for r in d["rows"]:
        t = np.asarray(r["times"])
        aE, aF = np.asarray(r["align_E"]), np.asarray(r["align_F"])
        w = t <= A.T_FIG4 + 1e-9
        assert t[-1] == r.get("t_end", A.T_END) and np.allclose(np.diff(t), 0.25)  # (a level to its own T)
        for key, val in (("t_exit", exit_time(t, aE)), ("t_EF", transition_time(t, aE, aF)),
                         ("t_exit_20", exit_time(t[w], aE[w])), ("t_EF_20", transition_time(t[w], aE[w], aF[w]))):
            assert (r[key] is None and np.isnan(val)) or r[key] == val, (r["nside_max"], key)
        assert r["plateau_w2"] == min(np.asarray(r["W2"])[w])
        assert r["mass_drift"] <= 1e-13 and r["min_f"] >= 0.0
    ch = A.changes(recs)
    assert ch[-1]["levels"] == [256, 512] and ch[-1]["t_exit"] <= A.BAR["t_exit"] / 2
    assert ch[-1]["plateau_w2"] <= A.BAR["plateau_w2"] / 5
    tex = [r["t_exit"] for r in recs]
    assert all(a > b for a, b in zip(tex, tex[1:])) and ch[0]["t_exit"] > A.BAR["t_exit"]  # 8.7 % at 64 -> 128
    assert [r["t_EF"] is None for r in recs] == [True, True, True, False]
    # the tails (README, "Refining the tails"): with nside_min 32 the exit is the same to 1e-4 relative and
    # F overtakes E by T at both levels, where nside_min 16 holds the third state past T
    tails = {r["nside_max"]: r for r in d["rows"] if r["nside_min"] == 32 and not r.get("attended")}
    base = {r["nside_max"]: r for r in recs}
    assert sorted(tails) == [128, 256]
    for n, r in tails.items():
        assert abs(r["t_exit"] - base[n]["t_exit"]) <= 1e-4 * base[n]["t_exit"]
        assert base[n]["t_EF"] is None and r["t_EF"] is not None and r["t_EF"] < 20.0
        assert r["align_F"][-1] > 0.5 > base[n]["align_F"][-1]


def test_fig4_attended_ladder_on_disk_moves_with_the_tails_not_with_nside_max():
    """The ladder of Refinement(attended=True) in adaptive.json (README, "The attended refinement"): the
    tails that carry attention weight are refined, so the third state no longer freezes and F overtakes E
    before t = 20 at every level; t_exit, t_EF and the plateau meet the issue's bar between nside_max 256
    and 512 (measured 0.3 %, 1.2 %, 0.1 %), and t_exit is the default ladder's to 0.1 % at every level
    (the exit does not rest on the tails). But t_EF moves by far more than the bar when the coarsest cells
    go from nside 16 to 32 at nside_max 128 (18.50 to 15.36): the tails' history before they count as
    significant is still on the coarsest cells, so the ladder's agreement is not the equation's t_EF."""
    import json

    from validation.fig4_concentration import adaptive as A

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive.json").read_text())
    att = A.ladder(d["rows"], attended=True)
    base = {r["nside_max"]: r for r in A.ladder(d["rows"])}
    assert [r["nside_max"] for r in att] == [64, 128, 256, 512] and all(r["attended"] for r in att)
    assert all(r["t_EF_20"] is not None and r["t_EF_20"] < 20.0 for r in att)
    ch = A.changes(att)[-1]
    assert ch["levels"] == [256, 512]
    assert all(ch[q] <= A.BAR[q] for q in A.BAR) and A.verdict(ch) == "yes"
    for r in att:
        assert abs(r["t_exit"] - base[r["nside_max"]]["t_exit"]) <= 1e-3 * r["t_exit"]
    by = {r["nside_max"]: r for r in att}
    m32 = [r for r in d["rows"] if A.refinement_of(r) == (True, None, 0.0) and r["nside_min"] == 32 and r["beta"] == 30.0]
    assert 128 in {r["nside_max"] for r in m32}
    for r in m32:
        assert abs(r["t_EF"] - by[r["nside_max"]]["t_EF"]) > 5 * A.BAR["t_EF"] * r["t_EF"]
        assert abs(r["t_exit"] - by[r["nside_max"]]["t_exit"]) <= 1e-4 * r["t_exit"]


def test_fig4_terminal_phase_on_disk_t_EF_is_ill_conditioned_t_depart_and_drift_converge():
    """README, "What t_EF rests on" (adaptive.json, the attended refinement): after the stall cone the
    density reaches a third state where align E and align F differ by a small gap (-0.01 to 0.06 over the
    levels), then drifts slowly (align F - align E grows at ~0.025 per time unit), so that
    t_EF ~ t_depart + 1 + gap / drift: an error in the gap moves t_EF ~40 times as much. Asserted on the
    records: (1) that decomposition holds on every attended level at nside_max >= 128 (within 0.65: the drift
    is slower just after the departure than over [20, 28]), and it carries the whole spread of t_EF (15.0 to
    18.5: gap / drift spreads by more than 2 while t_depart + 1 spreads by ~1.5); (2) the departure from the
    stall cone converges in the tails' resolution (nside_max 128, nside_min 32 -> 64: 0.5 %, within the
    issue's 2 %), t_EF does not (7.1 %, and not monotonically: 18.51, 15.36, 16.53 for nside_min 16, 32,
    64); (3) the drift agrees to 10 % over those levels; the conditioning 1 / drift is >= 35 on each."""
    import json

    from validation.fig4_concentration import adaptive as A

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive.json").read_text())
    att = [r for r in d["rows"] if A.refinement_of(r) == (True, None, 0.0) and r["nside_max"] >= 128 and r["beta"] == 30.0]
    assert len(att) >= 6
    m = {(r["nside_min"], r["nside_max"]): (r, A.terminal(r)) for r in att}
    for (r, t) in m.values():
        assert t["t_depart"] is not None and t["drift"] is not None and r["t_EF"] is not None
        assert abs(r["t_EF"] - t["t_depart"] - 1.0 - t["gap"] / t["drift"]) <= 0.65
        assert 1.0 / t["drift"] >= 35.0
    ratio = [t["gap"] / t["drift"] for _, t in m.values()]
    assert max(ratio) - min(ratio) > 2.0
    drift = [t["drift"] for _, t in m.values()]
    assert max(drift) / min(drift) - 1 <= 0.10
    ladder = [m[(n, 128)] for n in (16, 32, 64)]
    ch = A.changes([r for r, _ in ladder], by="nside_min")
    assert ch[-1]["levels"] == [32, 64] and ch[-1]["t_depart"] <= A.BAR["t_EF"] / 2
    assert ch[-1]["t_EF"] > A.BAR["t_EF"] * 3
    tef = [r["t_EF"] for r, _ in ladder]
    assert tef[1] < tef[2] < tef[0]  # not monotone in nside_min


def test_fig4_uniform_f0_on_adaptive_grids_on_disk():
    """validation/fig4_concentration/adaptive_uniform.json (README, "The uniform f0 on adaptive grids"), one
    ladder per beta (30 and 100): the rows are the readings of the stored records (recomputed here: not
    stale); on every level the density stays on E (no t_exit by T = 30, align E >= 0.999 at T), mass is exact
    and f >= 0; the plateau is the finest cell's, plateau / h equal on all levels of a ladder to 1 % and
    halving with h (ratio 2 to 2 %: a plateau that converged to a number would not halve); and the
    concentration times t(W2 <= w) meet the issue's 2 % bar between the two finest levels of each ladder."""
    import json

    import numpy as np

    mod = C.load_study("fig4_concentration")
    from validation.fig4_concentration import adaptive_uniform as U

    d = json.loads((C.VALID / "fig4_concentration" / "adaptive_uniform.json").read_text())
    recs, rows = d["records"], d["rows"]
    assert sorted({r["beta"] for r in recs}) == d["betas"] and {30.0, 100.0} <= set(d["betas"])
    assert all(r["f0"] == "uniform" for r in recs)  # adaptive_rows hands them to ladder.csv as they are
    assert json.loads(json.dumps([U.readings(r) for r in recs])) == rows
    for beta, rs in U.by_beta(rows):
        rc = [r for r in recs if r["beta"] == beta]
        assert [r["nside_max"] for r in rc] == [r["nside_max"] for r in rs] and len(rs) >= 3
        for r, row in zip(rc, rs):
            t, W = np.asarray(r["times"]), np.asarray(r["W2"])
            assert r["t_exit"] is None and r["t_EF"] is None and r["align_E"][-1] >= 0.999
            assert r["plateau_w2"] == W[t <= 20 + 1e-9].min() and r["mass_drift"] <= 1e-13 and r["min_f"] >= 0.0
            assert row["plateau_over_h"] == r["plateau_w2"] / U.cell_size(r["nside_max"])
        ph = [row["plateau_over_h"] for row in rs]
        assert max(ph) / min(ph) < 1.01, (beta, ph)
        for c in U.changes(rs):
            assert abs(c["plateau_ratio"] - c["levels"][1] / c["levels"][0]) < 0.02 * c["plateau_ratio"]
        last = U.changes(rs)[-1]
        for w in U.W2_LEVELS:
            assert last[f"t_w2_{w:g}"] is not None and last[f"t_w2_{w:g}"] <= U.BAR, (beta, w, last)
    assert mod.adaptive_rows()  # the ladder.csv test reads these rows too


def test_transition_law_adaptive_ladder_fits_only_the_small_amplitudes():
    """validation/transition_law/adaptive.py's ladder section on synthetic rows (no run): a pair of levels
    within the 2 % bar counts as converged; the law t = a + b log(1 / eps) is fitted over the converged exits
    at and below the anchor's eps (fig4's converged 0.05) and recovers the two-cluster line the rows were made
    on; a converged exit at a larger amplitude (here off the line by 0.5) is reported beside the law, not
    fitted (fitted, it would move b by ~0.1), and counts in the span of decades."""
    import math
    import re

    from validation.transition_law import adaptive as mod

    # the law through the anchor (fig4's finest converged beta-30 exit), as the section reads it
    a_law, b_law, eps0, _, beta, _ = mod._law()
    assert (eps0, beta) == (0.05, 30.0) and b_law == 1 / math.tanh(30.0)
    law = lambda e: a_law + b_law * math.log(1 / e)  # noqa: E731

    def row(eps, n, t, t_ef=float("nan")):
        return {"eps": eps, "nside_max": n, "t_exit": t, "t_EF": t_ef}

    rows = [row(1e-2, 512, law(1e-2) + 0.05), row(1e-2, 1024, law(1e-2)),
            row(1e-3, 1024, law(1e-3) + 0.02, 22.0), row(1e-3, 2048, law(1e-3), 22.1),
            # t_exit 7 % apart: not converged, not fitted; t_EF 0.4 %: converged
            row(1e-4, 2048, law(1e-4) + 1.0, 27.0), row(1e-4, 4096, law(1e-4), 26.9),
            row(0.5, 256, law(0.5) + 0.51, 15.0), row(0.5, 512, law(0.5) + 0.5, 18.0),  # t_EF 17 %: not
            row(0.6, 128, law(0.6), 16.0), row(0.6, 256, law(0.6), 16.05)]  # t_EF converged, above eps0: not in the line
    text = "\n".join(mod.ladder_section(rows))
    fit = re.search(r"t_exit = ([0-9.]+) \+ ([0-9.]+) log\(1 / eps\) \(largest residual ([0-9.]+)\), over ([0-9.]+) "
                    r"decades", text)
    a_fit, b_fit, res, dec = (float(g) for g in fit.groups())
    # the anchor lies on the law by construction (a_law is made from it), the rows are on it: exact to the
    # three decimals printed
    assert abs(b_fit - b_law) <= 1e-3 and abs(a_fit - a_law) <= 2e-3 and res <= 1e-3
    assert dec == 1.7  # 0.05 -> 1e-3; 1e-4 is not converged
    assert "over 2.8 decades of eps" in text  # all converged exits: 0.6 -> 1e-3
    assert re.search(r"eps 0\.5: %.2f, the law %.2f" % (law(0.5) + 0.5, law(0.5)), text)
    assert "| 1e-04 | 2048 -> 4096 |" in text and "NO / yes" in text.split("| 1e-04 | 2048 -> 4096 |")[1].split("\n")[0]
    # the converged t_EF (1e-3 and 1e-4, not 0.5) and the line through them: b = (26.9 - 22.1) / ln 10
    assert "The converged t_EF: eps 0.6: 16.05 (nside_max 256), eps 0.001: 22.10 (nside_max 2048), eps 0.0001: 26.90 " \
        "(nside_max 4096)" in text
    b_ef = float(re.search(r"t_EF = [0-9.]+ \+ ([0-9.]+) log", text).group(1))
    assert abs(b_ef - 4.8 / math.log(10.0)) <= 5e-3


def test_transition_law_adaptive_other_beta_runs_beside_the_study():
    """validation/transition_law/adaptive.py --beta: another beta's levels are sweeps of their own (a suffix in
    the name, so the study's finished members keep theirs) with only model.beta changed."""
    from validation.transition_law import adaptive as mod
    assert mod.spec(128).name == "transition_law_adaptive_128"  # the study's beta: the names of before
    assert mod.spec(128, beta=30.0).name == "transition_law_adaptive_128"
    sp10 = mod.spec(64, [0.05, 0.5], beta=10.0)
    assert sp10.name == "transition_law_adaptive_beta10_eps5e-02_5e-01"
    assert mod.spec(256, beta=10.0).name == "transition_law_adaptive_beta10_256"
    ms = sp10.members()
    assert sorted(m.config.initial.eps for m in ms) == [0.05, 0.5]
    for m in ms:
        g, c = m.config.grid, m.config
        assert (g.type, g.nside_min, g.nside_max) == ("adaptive", 16, 64)
        assert c.model.beta == 10.0 and c.time.t_end == 35.0
    # another base level (the tails' resolution): a ladder of its own, files and sweeps suffixed
    m32 = mod.spec(256, [0.05], beta=10.0, nside_min=32)
    assert m32.name == "transition_law_adaptive_beta10_min32_256_eps5e-02"
    assert mod.suffix(10.0, 32) == "_beta10_min32" and mod.suffix(30.0) == "" and mod.suffix(30.0, 32) == "_min32"
    g = m32.members()[0].config.grid
    assert (g.nside_min, g.nside_max) == (32, 256)
    # another error-control tolerance (the step-size ladder): a sweep of its own with only scheme.rtol changed
    r4 = mod.spec(256, [0.05], beta=10.0, rtol=1e-4)
    assert r4.name == "transition_law_adaptive_beta10_rtol1e-04_256_eps5e-02"
    assert mod.suffix(10.0, rtol=1e-4) == "_beta10_rtol1e-04"
    c4, c0 = r4.members()[0].config, mod.spec(256, [0.05], beta=10.0).members()[0].config
    assert c4.scheme.rtol == 1e-4 and c0.scheme.rtol != 1e-4
    assert c4.scheme == type(c0.scheme)(**{**c0.scheme.__dict__, "rtol": 1e-4})  # nothing else differs


def test_transition_law_adaptive_takes_fig4s_refinement_from_beta_100_and_t_end():
    """From beta 100 the law's members run on Figure 4's ladder setting at that beta (its anchor's: the attended
    refinement on nside 32 base cells, the attention criterion where f varies > 0.25), which is the beta's own
    base level (no "_min32" suffix); ``t_end`` other than 35 is a sweep of its own with only time.t_end changed,
    and the reports state each row's T (rows written before T was recorded ran to 35)."""
    from validation.fig4_concentration import adaptive as fig4
    from validation.transition_law import adaptive as mod

    sp = mod.spec(256, [0.2, 1e-2], beta=100.0, t_end=12.0)
    assert sp.name == "transition_law_adaptive_beta100_256_T12_eps2e-01_1e-02"
    assert mod.suffix(100.0) == "_beta100" and mod.suffix(100.0, 64) == "_beta100_min64"
    anchor = fig4.spec(100.0, 256, 32, attended=True, attention_variation=0.25, t_end=12.0).members()[0].config
    for m in sp.members():
        c = m.config
        assert c.grid == anchor.grid and c.model == anchor.model and c.scheme == anchor.scheme
        assert c.time == anchor.time  # T 12, as fig4's finest beta 100 level
        assert c.initial.eps in (0.2, 1e-2) and c.initial.type == anchor.initial.type
    # below beta 100 nothing changes: the default refinement on nside 16, T 35
    c10 = mod.spec(256, [0.05], beta=10.0).members()[0].config
    assert (c10.grid.nside_min, c10.grid.attended, c10.grid.attention_variation, c10.time.t_end) == (16, None, None, 35.0)
    t12 = mod.spec(256, [0.05], beta=10.0, t_end=12.0)
    assert t12.name == "transition_law_adaptive_beta10_256_T12_eps5e-02"
    assert t12.members()[0].config.time.t_end == 12.0
    assert mod.t_ends([{"nside_max": 64}, {"nside_max": 128, "t_end": 35.0}]) == "35"
    assert mod.t_ends([{"nside_max": 64, "t_end": 12.0}, {"nside_max": 128}]) == "12 (nside_max 64), 35 (nside_max 128)"


def test_transition_law_adaptive_anchors_at_its_own_converged_exit():
    """At a beta without a converged Figure 4 exit (beta 10), the law is anchored at the ladder's own converged
    exit of eps 0.05, which then enters the fit once (not as an anchor and again as a row); without one no law is
    drawn and the ladder, the fit and the slopes are still reported."""
    import math
    import re

    from validation.transition_law import adaptive as mod

    a0, b0 = 3.0, 1.0 / math.tanh(10.0)
    line = lambda e: a0 + b0 * math.log(1 / e)  # noqa: E731

    def row(eps, n, t):
        return {"eps": eps, "nside_max": n, "t_exit": t, "t_EF": float("nan")}

    rows = [row(0.05, 64, line(0.05) + 0.3), row(0.05, 128, line(0.05) + 0.1), row(0.05, 256, line(0.05)),
            row(1e-2, 128, line(1e-2) + 0.02), row(1e-2, 256, line(1e-2)),
            row(1e-3, 128, line(1e-3) + 0.03), row(1e-3, 256, line(1e-3))]
    law = mod._law(10.0, rows)
    assert law is not None
    a_law, b_law, eps0, t0, beta, anchor = law
    assert (eps0, beta, anchor["source"], anchor["nside_max"]) == (0.05, 10.0, "ladder", 256)
    assert abs(t0 - line(0.05)) < 1e-12 and abs(a_law - a0) < 1e-12 and b_law == b0
    text = "\n".join(mod.ladder_section(rows, 10.0))
    assert "this ladder's nside_max 256, converged there" in text
    conv = text.split("The converged exits: ")[1].split(", over")[0]
    assert conv.count("eps 0.05:") == 1, conv  # the anchor is one of the rows: once
    a_fit, b_fit = (float(g) for g in re.search(r"t_exit = ([0-9.]+) \+ ([0-9.]+) log", text).groups())
    assert abs(a_fit - a0) <= 1e-3 and abs(b_fit - b0) <= 1e-3
    # each level's own 0.05 exit in the slopes (no anchor value put in its place): 128's is 0.1 above the line
    # (1.7 %: converged to 256)
    slope128 = text.split("| 128 | ")[1].split(" |")[0]
    assert slope128 == f"{(line(1e-2) + 0.02 - line(0.05) - 0.1) / math.log(5):.2f}"
    # 0.05 not converged (64 -> 128 only, 9 % apart): no law, but the table and the fit over the rest
    rows2 = [r for r in rows if not (r["eps"] == 0.05 and r["nside_max"] == 256)]
    rows2[1] = row(0.05, 128, line(0.05) + 0.3 + 0.5)
    assert mod._law(10.0, rows2) is None
    text2 = "\n".join(mod.ladder_section(rows2, 10.0))
    assert "two-cluster law: none drawn" in text2 and "| 5e-02 | 64 -> 128 |" in text2
    assert "| yes / none by T at both | - | - |" in text2
    assert "t_exit = " in text2  # 1e-2 and 1e-3 are converged: fitted without the anchor


def test_transition_law_across_beta_summary(tmp_path):
    """adaptive_betas.md from every beta's adaptive*.json: the converged exits per beta, a(beta) at the anchor,
    the slope over the small amplitudes and a(beta) against log(beta) (synthetic beta-10 rows on a known line;
    the study's beta-30 rows as committed)."""
    import json
    import math
    import re
    import shutil

    from validation.transition_law import adaptive as mod

    shutil.copy(mod.HERE / "adaptive.json", tmp_path / "adaptive.json")
    a10 = 3.5
    line = lambda e: a10 + math.log(1 / e) / math.tanh(10.0)  # noqa: E731
    rows = [{"eps": e, "nside_max": n, "t_exit": line(e) + (0.5 if n == 64 else 0.0), "t_EF": float("nan")}
            for e in (0.05, 1e-2, 1e-3) for n in (64, 128, 256)]
    # a converged large amplitude off the line: listed, not fitted (fitted, b would be ~0.93)
    rows += [{"eps": 0.5, "nside_max": n, "t_exit": line(0.5) + 0.4, "t_EF": float("nan")} for n in (128, 256)]
    for r in rows:  # F at twice the exit time at eps 1e-2 (converged 128 -> 256 like the exit)
        if r["eps"] == 1e-2:
            r["t_EF"] = 2.0 * r["t_exit"]
    (tmp_path / "adaptive_beta10.json").write_text(json.dumps({"nside_min": 16, "rows": rows}))
    text = "\n".join(mod.write_betas(here=tmp_path))
    assert (tmp_path / "adaptive_betas.md").read_text() == text + "\n"
    r10 = [ln for ln in text.splitlines() if ln.startswith("| 10 (T 35) |")][0]
    assert "| 64, 128, 256 |" in r10 and "5e-02: %.2f (256)" % line(0.05) in r10 and "5e-01: " in r10
    assert "| 3.500 |" in r10 and "| 1.000 (3: 5e-02 to 1e-03) |" in r10
    r30 = [ln for ln in text.splitlines() if ln.startswith("| 30 (T ")][0]  # T 25 at one level, 35 at the others
    a30 = float(r30.split(" | ")[3])
    assert "1e-02: 2.000" in r10  # the ratio column
    assert re.search(r"where both times converged: 1\.99[0-9] to 2\.000 \(beta 10, eps 1e-02, beta 30, eps 1e-04, "
                     r"beta 30, eps 1e-03\)", text)
    assert "| - | 1e-02: 2.000 |" in r10  # one converged t_EF at eps <= 0.05: no line through it
    got = float(re.search(r"from beta 10 to 30: ([-0-9.]+) per e-fold", text).group(1))
    assert abs(got - (a30 - a10) / math.log(3.0)) <= 1e-3


def test_transition_law_beta100_on_disk():
    """adaptive_beta100.json (transition_law/README.md, "The law at beta 100"): on Figure 4's setting at beta 100,
    eps 0.2 converges (last step <= 2 %) onto the two-cluster law anchored at Figure 4's converged eps 0.05 exit
    (within 0.5 %; at beta 30 eps 0.2 sat 0.1 % before its law), which with that exit gives the slope b = 1 /
    tanh(100) to 1 %; eps 1e-2 comes down onto the law from above level by level (no exit by T = 12 at 128, then
    steps above the bar) and converges at nside_max 1024, on the law within 0.5 %: the fit over the converged exits
    at eps <= 0.05 (Figure 4's and 1e-2) has b within 2 % of 1. eps 1e-3 (T = 14) does the same one level later
    and converges at 4096 on the law within 0.5 %, and the fit over the three converged exits at eps <= 0.05 has b
    within 1 % of 1; eps 0.5 converges at 512 (outside the linearisation: within 2 % of the law). Every row on the
    beta's setting to T = 12 (14 for eps 1e-3, its 2048 and 4096 members continued to 30; the eps 0.5 members continued to 50, where neither level reaches F
    and both sit near the third state, align E = align F_abs), mass to 1e-14 and f >= 0."""
    import json
    import math

    from validation.fig4_concentration.adaptive import BAR
    from validation.transition_law import adaptive as mod

    rows = json.loads((mod.HERE / "adaptive_beta100.json").read_text())["rows"]
    def t_end(r):  # eps 1e-3 at 2048 and 4096 continued from 14 to 30 (2026-12-07)
        return (30.0 if r["nside_max"] >= 2048 else 14.0) if r["eps"] == 1e-3 else 50.0 if r["eps"] == 0.5 else 12.0

    assert all(r["t_end"] == t_end(r) and r["mass_drift"] <= 1e-14 and r["min"] >= 0.0 for r in rows)
    a, b, eps0, t0, beta, anchor = mod._law(100.0, rows)
    assert (beta, eps0, anchor["source"], anchor["nside_max"]) == (100.0, 0.05, "fig4", 512)
    by = {e: {r["nside_max"]: r["t_exit"] for r in rows if r["eps"] == e} for e in (0.2, 1e-2)}
    s02 = sorted(by[0.2])
    assert s02[-3:] == [128, 256, 512]
    last = mod._step(by[0.2][256], by[0.2][512])
    assert last <= BAR["t_exit"] and last < mod._step(by[0.2][128], by[0.2][256])
    law02 = a + b * math.log(1 / 0.2)
    assert abs(by[0.2][512] / law02 - 1) <= 5e-3
    assert abs((t0 - by[0.2][512]) / math.log(0.2 / 0.05) - 1 / math.tanh(100.0)) <= 1e-2
    law = a + b * math.log(1 / 1e-2)
    ups = [by[1e-2][n] for n in (256, 512, 1024)]
    assert not math.isfinite(by[1e-2][128])  # no exit by T = 12 at the coarsest level
    assert ups[0] > ups[1] > ups[2] > law
    assert mod._step(*ups[:2]) > BAR["t_exit"] >= mod._step(*ups[1:])
    assert abs(ups[2] / law - 1) <= 5e-3
    conv = mod.converged(rows)
    assert conv[0.2] == (by[0.2][512], 512) and conv[1e-2] == (ups[2], 1024)
    _, b_fit, _ = mod._fit([(0.05, t0, "fig4"), (1e-2, ups[2], "1024")])
    assert abs(b_fit - 1 / math.tanh(100.0)) <= 2e-2
    # eps 1e-3 (T = 14, measured 2026-12-06) comes down onto its law from above as 1e-2 did, one level later:
    # 13.75, 12.17, 11.82 at 512, 1024, 2048 (steps 13 % and 3.0 %, above the bar), then 11.76 at 4096 (0.5 %)
    e3 = {r["nside_max"]: r["t_exit"] for r in rows if r["eps"] == 1e-3}
    law3 = a + b * math.log(1 / 1e-3)
    assert sorted(e3) == [512, 1024, 2048, 4096] and e3[512] > e3[1024] > e3[2048] > law3
    assert mod._step(e3[1024], e3[2048]) > BAR["t_exit"] >= mod._step(e3[2048], e3[4096])
    assert conv[1e-3] == (e3[4096], 4096) and abs(e3[4096] / law3 - 1) <= 5e-3
    _, b3, _ = mod._fit([(0.05, t0, "fig4"), (1e-2, ups[2], "1024"), (1e-3, e3[4096], "4096")])
    assert abs(b3 - 1 / math.tanh(100.0)) <= 1e-2
    # the 2048 and 4096 members continued to T = 30 (2026-12-07): past the stall cone and turning towards F, not
    # there by T on either level (align E / F / F_abs 0.379 / 0.233 / 0.388 and 0.384 / 0.221 / 0.394 at T, within
    # 0.015 of each other): no t_EF by 30
    fin = {n: next(r for r in rows if r["eps"] == 1e-3 and r["nside_max"] == n) for n in (2048, 4096)}
    for r in fin.values():
        fE, fF, fFa = r["final_align"]
        assert not math.isfinite(r["t_EF"]) and 0.2 < fF < fE and abs(fE - fFa) < 0.02
    assert max(abs(a - b) for a, b in zip(fin[2048]["final_align"], fin[4096]["final_align"])) < 0.015
    # eps 0.5: 256 and 512 within the bar, 1 % over the law (outside the linearisation; at beta 30 0.6 % under)
    e5 = {r["nside_max"]: r["t_exit"] for r in rows if r["eps"] == 0.5}
    assert sorted(e5) == [256, 512] and mod._step(e5[256], e5[512]) <= BAR["t_exit"]
    assert conv[0.5] == (e5[512], 512) and abs(e5[512] / (a + b * math.log(2.0)) - 1) <= 2e-2
    # continued to T = 50 (2026-12-06/07): the departure from E's plateau (align E < 0.99) the same on both levels,
    # and neither reaches F by T (no t_EF at beta 100 on this ladder); at T both are near the third state of beta
    # 30's ladder mirrored in x2 (two clusters of mass 1/2 on one side of x2 = 0): align E = align F_abs within
    # 0.005 (measured 0.003 and 0.001; they differed by up to 0.15 while the 512 level swung between the cone and
    # it), align F 0.2-0.3 (0.205, 0.269)
    r5 = {r["nside_max"]: r for r in rows if r["eps"] == 0.5}
    assert mod._step(r5[256]["t_depart"], r5[512]["t_depart"]) <= BAR["t_exit"]
    assert r5[256]["t_depart"] < e5[256] and not any(math.isfinite(r["t_EF"]) for r in r5.values())
    for r in r5.values():
        e, f, fa = r["final_align"]
        assert abs(e - fa) <= 5e-3 and 0.2 <= f <= 0.3 < e


def test_transition_law_steps_section_pairs_the_same_level_and_amplitude():
    """--rtol: the times at the smaller tolerance against the default's at the same (nside_max, eps) only, with
    the relative difference (the default tolerance's time error) and both step counts."""
    from validation.transition_law import adaptive as mod

    def row(eps, n, te, tf, steps):
        return {"eps": eps, "nside_max": n, "t_exit": te, "t_EF": tf, "steps": steps}

    base = [row(0.05, 256, 6.0, 12.0, 3000), row(0.05, 512, 5.0, 10.0, 3100), row(1e-2, 256, 8.0, 16.0, 3200)]
    rows = [row(0.05, 256, 6.03, 12.0, 9000), row(1e-2, 256, 8.0, 16.4, 9100), row(1e-3, 256, 11.0, 22.0, 9200)]
    L = mod.steps_section(rows, base, 1e-4)
    assert "## The step size: rtol 0.0001 against the default 0.001" in L
    body = [ln for ln in L if ln.startswith("| ") and not ln.startswith("| eps")]
    assert len(body) == 2  # 1e-3 has no default-tolerance partner; the 512 row has no partner either
    assert body[0] == "| 5e-02 | 256 | 6.000000 / 6.030000 | 5.0e-03 | 12.000000 / 12.000000 | 0.0e+00 | 3000 / 9000 |"
    assert body[1] == "| 1e-02 | 256 | 8.000000 / 8.000000 | 0.0e+00 | 16.000000 / 16.400000 | 2.4e-02 | 3200 / 9100 |"


def test_transition_law_tails_section_pairs_the_same_level_and_amplitude():
    """--nside-min 32: the times against the base-16 ladder's at the same (nside_max, eps) only."""
    from validation.transition_law import adaptive as mod

    def row(eps, n, te, tf, cells):
        return {"eps": eps, "nside_max": n, "t_exit": te, "t_EF": tf, "cells_T": cells}

    base = [row(0.05, 256, 6.0, 12.0, 3000), row(0.05, 512, 5.0, 10.0, 3100), row(1e-2, 256, 8.0, float("nan"), 3200)]
    rows = [row(0.05, 256, 6.3, 12.0, 12000), row(1e-2, 256, 8.0, 16.0, 12100), row(1e-3, 256, 11.0, 22.0, 12200)]
    L = mod.tails_section(rows, base, 32)
    body = [ln for ln in L if ln.startswith("| ") and not ln.startswith("| eps")]
    assert len(body) == 2  # 1e-3 has no base-16 partner
    assert body[0] == "| 5e-02 | 256 | 6.000000 / 6.300000 | 4.8e-02 | 12.000000 / 12.000000 | 0.0e+00 | 3000 / 12000 |"
    assert body[1].startswith("| 1e-02 | 256 | 8.000000 / 8.000000 | 0.0e+00 | none / 16.000000 | - |")


def test_zero_temperature_exact_curves_match_independent_evaluations():
    """fig4_concentration/zero_temperature.py's closed form of W2(rho_t, Pi#rho_0) and the alignments at
    beta = inf, against three independent evaluations.
    (a) Its characteristics X_t = e^{tA} x / |e^{tA} x| are those of the package's zero-temperature field
        (solve_ivp of ZeroTemperature.velocity; 1e-8: the ODE's tolerances).
    (b) The perturbed f0's cell masses on HEALPix nside 64 pushed along them, W2 by wasserstein2_two_atoms,
        at t = 0.5 and 1, where the band |x_1| < e^{-2t} that carries W2 spans >= 8 cells: a midpoint
        quadrature, relative error ~h^2 (measured below 1e-3); the perturbation must drop out.
    (c) The raw integrands 2 (1 - |<X_t, e1>|) and <X_t, e_i>^2 integrated numerically in (u, phi) by a
        tensor Gauss-Legendre rule on panels graded to the integrands' scales, at t = 2, 3, 5, where (b) would
        need h << e^{-2t}: this checks the three antiderivatives in u to 1e-10 (nested adaptive scipy quad
        did it to 1e-6 in 20 s; this rule is exact to ~1e-14 in 0.2 s).
    A sign or factor error in any u-integral is off by 1e-2 or more."""
    import math

    import numpy as np
    from scipy.integrate import solve_ivp

    from spherepde import HealpixGrid, ZeroTemperature
    from spherepde.config import MATRIX_PRESETS, perturbed_uniform
    from spherepde.wasserstein import wasserstein2_two_atoms
    from validation.fig4_concentration import zero_temperature as Z

    p = MATRIX_PRESETS["paper"]
    model = ZeroTemperature(p["B"], p["V"])
    A = np.array([1.0, -1.0, -2.0])

    def push(x, t):
        y = x * np.exp(t * A)
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    x = np.random.default_rng(0).normal(size=(500, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sol = solve_ivp(lambda t, y: model.velocity(y.reshape(-1, 3), t).ravel(), (0.0, 3.0), x.ravel(),
                    rtol=1e-11, atol=1e-12)
    assert np.abs(sol.y[:, -1].reshape(-1, 3) - push(x, 3.0)).max() < 1e-8  # (a)

    g = HealpixGrid(64)
    w = perturbed_uniform(g.centers, 0.05) * g.areas
    e1 = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    m_plus = w[g.centers[:, 0] > 0].sum() / w.sum()
    ex = Z.exact_curves([0.5, 1.0])
    for k, t in enumerate((0.5, 1.0)):  # (b)
        X = push(g.centers, t)
        w2 = wasserstein2_two_atoms(X, w, e1, [m_plus, 1.0 - m_plus])
        assert abs(w2 / ex["W2"][k] - 1.0) < 1e-3, (t, w2, ex["W2"][k])
        for i, key in enumerate(("align_E", "align_F", "align_Fabs")):
            a = float(np.sum(w * X[:, i] ** 2) / w.sum())
            assert abs(a / ex[key][k] - 1.0) < 1e-3, (t, key, a, ex[key][k])

    gl, wl = np.polynomial.legendre.leggauss(20)

    def panels(edges, x0=0.0, sign=1.0):
        """A 20-point Gauss-Legendre rule on each panel between consecutive edges (nodes x0 + sign * x)."""
        x = np.concatenate([0.5 * (b - a) * gl + 0.5 * (b + a) for a, b in zip(edges, edges[1:])])
        return x0 + sign * x, np.concatenate([0.5 * (b - a) * wl for a, b in zip(edges, edges[1:])])

    for t in (2.0, 3.0, 5.0):  # (c)
        ex = Z.exact_curves([t])
        # u in (0, 1): panels graded geometrically towards 0 at the band's scale e^{-2t}; phi in (0, pi / 2):
        # towards pi / 2 at e^{-t}, where e^{-2t} sin(phi) overtakes e^{-t} cos(phi) in the third component.
        # Each integrand is smooth on each panel: the rule is exact to ~1e-14 here (40 points a panel agree
        # with 20 to 2e-14, measured), so 1e-10 tests the closed form, not the rule
        band, turn = math.exp(-2.0 * t), math.exp(-t)
        U, WU = panels([0.0] + [band * 2.0 ** k for k in range(-6, 60) if band * 2.0 ** k < 1.0] + [1.0])
        P, WP = panels([0.0] + [turn * 2.0 ** k for k in range(-6, 60) if turn * 2.0 ** k < math.pi / 2]
                       + [math.pi / 2], x0=math.pi / 2, sign=-1.0)
        u, ph = np.meshgrid(U, P, indexing="ij")
        r = np.sqrt(1.0 - u * u)
        X = push(np.stack([u, r * np.cos(ph), r * np.sin(ph)], axis=-1), t)
        W = WU[:, None] * WP[None, :] * 8.0 / (4.0 * math.pi)  # u < 0 and the four quadrants of phi, rho = 1 / 4 pi
        got = {"W2": math.sqrt(np.sum(W * 2.0 * (1.0 - np.abs(X[..., 0]))))}
        got.update({key: float(np.sum(W * X[..., i] ** 2))
                    for i, key in enumerate(("align_E", "align_F", "align_Fabs"))})
        for key, val in got.items():
            assert abs(val / ex[key][0] - 1.0) < 1e-10, (t, key, val, ex[key][0])
    # the closed form's large-t limit: W2 ~ (2 / sqrt(pi)) e^{-t}, and the alignments sum to 1
    late = Z.exact_curves([20.0])
    assert abs(late["W2"][0] / (2.0 / np.sqrt(np.pi) * np.exp(-20.0)) - 1.0) < 1e-6
    assert abs(sum(late[k][0] for k in ("align_E", "align_F", "align_Fabs")) - 1.0) < 1e-12


def test_zero_temperature_ladder_on_disk():
    """fig4_concentration/zero_temperature.json (beta = inf, committed runs) against the exact solution, the facts
    its README section states: no level has an exit or a t_EF; the plateau is 0.75-0.80 h of the finest cell on
    every level; refining nside_max alone on nside 16 coarsest cells stagnates (256 -> 512 moves each t(W2 <= w)
    by under 0.05 %, ten times less than what stays between it and the exact time, >= 0.05 %); rtol 1e-4 moves
    nothing (the same error to 5 %); and nside_min = nside_max / 4 converges to the exact times, each level's
    error below 0.45 of the previous one (observed order >= 1.15; measured 1.55-1.94)."""
    import json

    from validation.fig4_concentration.zero_temperature import W2_LEVELS

    d = json.loads((C.VALID / "fig4_concentration" / "zero_temperature.json").read_text())
    rows = d["rows"]
    assert rows and all(r["t_exit"] is None and r["t_EF"] is None for r in rows)
    assert all(0.75 <= r["plateau_over_h"] <= 0.80 for r in rows), [r["plateau_over_h"] for r in rows]

    def at(f0, nmin, nmax, rtol=None):
        return next(r for r in rows if (r["f0"], r["nside_min"], r["nside_max"], r["rtol"]) == (f0, nmin, nmax, rtol))

    for f0 in ("perturbed", "uniform"):
        a, b = at(f0, 16, 256), at(f0, 16, 512)
        for w in (f"{x:g}" for x in W2_LEVELS):
            step = abs(b["t_w2"][w] - a["t_w2"][w]) / b["t_w2"][w]
            assert step < 5e-4 and b["t_err"][w] >= 5e-4 and b["t_err"][w] > 10 * step, (f0, w, step, b["t_err"][w])
    base, fine_step = at("perturbed", 16, 128), at("perturbed", 16, 128, 1e-4)
    for w in (f"{x:g}" for x in W2_LEVELS):
        assert abs(fine_step["t_err"][w] / base["t_err"][w] - 1.0) < 0.05
    joint = sorted((r for r in rows if r["f0"] == "perturbed" and r["rtol"] is None
                    and r["nside_max"] == 4 * r["nside_min"]), key=lambda r: r["nside_max"])
    assert [r["nside_max"] for r in joint][:3] == [64, 128, 256]
    for a, b in zip(joint, joint[1:]):
        for w in (f"{x:g}" for x in W2_LEVELS):
            assert b["t_err"][w] < 0.45 * a["t_err"][w], (a["nside_max"], w, a["t_err"][w], b["t_err"][w])


def test_fig4_lagrangian_particles_carry_each_cells_mass_inside_the_cell():
    """lagrangian.py places a cell's mass f A on the centres of its 4^s NESTED descendants, m / 4^s each: the
    masses sum to the grid's mass to rounding, every point lies in its own cell (healpy's vec2pix at the
    cell's order gives the cell back), the points of one cell are distinct, and cells of zero mass (a
    collapsed density is 0 on most cells) get no points. Exact bookkeeping, so tolerances are rounding's."""
    import healpy as hp
    import numpy as np

    import spherepde as sp
    from validation.fig4_concentration import lagrangian as L

    g = sp.AdaptiveHealpixGrid(4, 16)
    g = g.adapt(refine=np.arange(g.n_cells) % 7 == 0)  # mixed orders
    rng = np.random.default_rng(3)
    f = rng.random(g.n_cells) * (np.arange(g.n_cells) % 5 != 0)  # zeros on a fifth of the cells
    mass = float(np.sum(f * g.areas))
    owner = np.nonzero(f > 0)[0]
    for split in (0, 1, 2):
        x, w = L.particles_of(g, f, split)
        q = 4 ** split
        assert x.shape == (owner.size * q, 3) and w.shape == (owner.size * q,)
        assert abs(w.sum() / mass - 1.0) <= 1e-13
        assert np.allclose(np.linalg.norm(x, axis=1), 1.0, rtol=0, atol=1e-14)
        cell = np.repeat(owner, q)
        np.testing.assert_allclose(w, (f * g.areas)[cell] / q, rtol=1e-15, atol=0)
        for k in np.unique(g.order[cell]):
            sel = g.order[cell] == k
            pix = hp.vec2pix(1 << int(k), x[sel, 0], x[sel, 1], x[sel, 2], nest=True)
            assert np.array_equal(pix, g.ipix[cell][sel])
        if split:
            per_cell = x.reshape(owner.size, q, 3)
            gaps = np.linalg.norm(per_cell[:, :, None] - per_cell[:, None], axis=-1) + np.eye(q)[None] * 9
            assert gaps.min() > 1e-3


def test_fig4_log_quadratic_ladder_and_its_lagrangian_continuations_on_disk():
    """README, "The log-quadratic scheme on the tails" and "The levels continued as weighted particles" (records
    log_tails.json and lagrangian.json). Asserted: (1) the log-quadratic departure from the stall cone converges
    in the tails' resolution (nside_min 16 -> 32: <= 1 % at nside_max 128 and 256) but not in nside_max (it moves
    by more than the issue's 2 % from 128 to 256, earlier), while the exit moves by <= 0.2 % across nside_min;
    (2) the continuation of the 32 / 128 state from t0 = 10 is converged in the time step (t_depart to 1e-6
    relative between dt 0.02 and 0.01) and in the points per cell (1 -> 4: 0.1 %); (3) against their exact
    continuation from t0 = 10 the 128 levels' own departures are early by more than 2 %, the 256 levels' (nside_min
    16 and 32) by less than 0.5 %; (4) from t0 = 4 the continuation is not converged in the points per cell (1 -> 4 -> 16 move
    the departure by more than 5 % each, in steps that do not shrink), though the two levels' states agree at
    each placement (0.5 %)."""
    from validation.fig4_concentration import adaptive as A

    here = C.VALID / "fig4_concentration"
    lt = {(r["nside_min"], r["nside_max"]): r for r in json.loads((here / "log_tails.json").read_text())}
    for nmax in (128, 256):
        a, b = lt[(16, nmax)], lt[(32, nmax)]
        assert abs(a["t_depart"] / b["t_depart"] - 1) <= 0.01
        assert abs(a["t_exit"] / b["t_exit"] - 1) <= 0.002
    for nmin in (16, 32):
        assert lt[(nmin, 256)]["t_depart"] < lt[(nmin, 128)]["t_depart"] * (1 - A.BAR["t_EF"])

    rows = json.loads((here / "lagrangian.json").read_text())
    run = {"128": "fig4_adaptive_b30_128_att_log-quadratic", "256": "fig4_adaptive_b30_256_att_log-quadratic",
           "128/32": "fig4_adaptive_b30_128_min32_att_log-quadratic",
           "256/32": "fig4_adaptive_b30_256_min32_att_log-quadratic"}  # nside_max (/ nside_min where not 16)

    def get(name, t0, split=0, dt=0.02):
        [r] = [r for r in rows if (r["run"], r["t0"], r["split"], r["dt"]) == (name, t0, split, dt)]
        return r["particles_readings"]["t_depart"], r["pde_readings"]["t_depart"]

    p1, pde = get(run["128/32"], 10.0)
    assert abs(get(run["128/32"], 10.0, dt=0.01)[0] / p1 - 1) <= 1e-6
    assert abs(get(run["128/32"], 10.0, split=1)[0] / p1 - 1) <= 1e-3
    for name in (run["128/32"], run["128"]):
        p, q = get(name, 10.0)
        assert q < p * (1 - 0.02)
    for name in (run["256"], run["256/32"]):
        p, q = get(name, 10.0)
        assert abs(q / p - 1) <= 0.005
    for split in (0, 1):
        assert abs(get(run["128"], 4.0, split)[0] / get(run["256"], 4.0, split)[0] - 1) <= 0.005
    # 1, 4, 16 points a cell: steps of ~1 time unit that do not shrink (the placement seeds the cone's instability)
    d = [get(run["128"], 4.0, k)[0] for k in (0, 1, 2)]
    assert d[1] > d[0] * 1.05 and d[2] > d[1] * 1.05 and (d[2] - d[1]) > 0.8 * (d[1] - d[0])


def test_fig4_departure_of_each_t0_state_continued_exactly_on_disk():
    """README, "The departure by t0: converged in nside_max at each t0, not across t0" (records lagrangian.json
    and lagrangian_restarts.json). Asserted: (1) the exact continuations of the nside_max 256 and 512 states
    (nside_min 16) from the same t0 depart within the issue's 2 % of each other at every t0 in 7 ... 10; (2) the
    continuations are converged in the placement (4 points a cell: <= 0.2 %) at t0 = 9 on both levels and at 7
    and 8 on 256 (at 7 the two levels agree to 0.2 % with 4 points a cell), and in the step (dt 0.01: 1e-4) at
    t0 = 9, but not in the placement at t0 = 6 (> 2 %); (3) on both levels the state at t0 = 10 departs earlier
    than the states at every t0 in 7 ... 9 by more than 2.5 %: the PDE's evolution in [9, 10] advances the departure alike on
    256 and 512; (4) that is not its step: the 256 level restarted from t0 = 9 reproduces its own departure to
    1e-4 with its own steps and to 1e-3 with max_dt 1e-3 (2.5 times the steps), while the exact continuation of
    the same state departs more than 3 % later; (5) it is in the clusters' cells: from t0 = 9 on, the states
    without their light cells (lagrangian_clusters.json) depart as the full ones; (6) the levels' own departures
    converge in nside_max, to a value below the exact continuations, and their t_EF converges in nside_max on
    each nside_min but not across it."""
    here = C.VALID / "fig4_concentration"
    rows = json.loads((here / "lagrangian.json").read_text())
    run = {256: "fig4_adaptive_b30_256_att_log-quadratic", 512: "fig4_adaptive_b30_512_att_T10_log-quadratic"}

    def dep(n, t0, split=0, dt=0.02):
        [r] = [r for r in rows if (r["run"], r["t0"], r["split"], r["dt"]) == (run[n], t0, split, dt)]
        return r["particles_readings"]["t_depart"]

    early = (7.0, 8.0, 8.5, 9.0)
    for t0 in early + (10.0,):
        assert abs(dep(512, t0) / dep(256, t0) - 1) <= 0.02, t0
    for n in (256, 512):
        assert abs(dep(n, 9.0, split=1) / dep(n, 9.0) - 1) <= 0.002
    assert abs(dep(256, 9.0, dt=0.01) / dep(256, 9.0) - 1) <= 1e-4
    for t0 in (7.0, 8.0):
        assert abs(dep(256, t0, split=1) / dep(256, t0) - 1) <= 0.002
    assert abs(dep(256, 7.0, split=1) / dep(512, 7.0, split=1) - 1) <= 0.002  # 4 points a cell at t0 = 7
    assert abs(dep(256, 6.0, split=1) / dep(256, 6.0) - 1) > 0.02  # t0 = 6: the placement is not converged
    for n in (256, 512):
        assert min(dep(n, t0) for t0 in early) > dep(n, 10.0) * 1.025, n

    restarts = json.loads((here / "lagrangian_restarts.json").read_text())
    [own] = [r for r in rows if (r["run"], r["t0"], r["split"], r["dt"]) == (run[256], 9.0, 0, 0.02)]
    level = own["pde_readings"]["t_depart"]
    by_dt = {r["max_dt"]: r for r in restarts if (r["run"], r["t0"]) == (run[256], 9.0)}
    assert abs(by_dt[None]["readings"]["t_depart"] / level - 1) <= 1e-4
    assert abs(by_dt[0.001]["readings"]["t_depart"] / level - 1) <= 1e-3
    assert by_dt[0.001]["steps"] > 2 * by_dt[None]["steps"]
    assert dep(256, 9.0) > level * 1.03

    # (5) the clusters' cells alone set the departure from t0 = 9 on (without every cell below 1e-6 of the mass:
    # <= 1e-3), the tails still act at t0 = 8 (without the cells below 1e-12: > 1 %)
    cut = {(r["run"], r["t0"], r["drop_below"]): r["particles_readings"]["t_depart"]
           for r in json.loads((here / "lagrangian_clusters.json").read_text())}
    for n, t0 in ((256, 9.0), (512, 9.0), (256, 10.0)):
        assert abs(cut[(run[n], t0, 1e-6)] / dep(n, t0) - 1) <= 1e-3, (n, t0)
    assert abs(cut[(run[256], 8.0, 1e-12)] / dep(256, 8.0) - 1) > 0.01

    # (6) the levels' own departures converge (256 against 512, the latter restarted from its state at t = 10 with
    # its own steps: within the issue's 2 %), below every exact continuation from t0 = 7 ... 9 by more than 2.5 %
    [own512] = [r["readings"]["t_depart"] for r in restarts if (r["run"], r["t0"], r["max_dt"]) == (run[512], 10.0, None)]
    assert abs(own512 / level - 1) <= 0.02
    # ... and so does t_EF on each nside_min (<= 2 %), > 10 % apart across nside_min at 512
    t_ef = {r["run"]: r["readings"]["t_EF"] for r in restarts if (r["t0"], r["max_dt"]) == (10.0, None)}
    lt = {(r["nside_min"], r["nside_max"]): r for r in json.loads((here / "log_tails.json").read_text())
          if r.get("t_end", 30.0) == 30.0}
    m512 = {16: t_ef[run[512]], 32: t_ef["fig4_adaptive_b30_512_min32_att_T10_log-quadratic"]}
    for nmin in (16, 32):
        assert abs(m512[nmin] / lt[(nmin, 256)]["t_EF"] - 1) <= 0.02, nmin
    assert m512[16] > m512[32] * 1.10
    for n in (256, 512):
        assert min(dep(n, t0) for t0 in early) > max(own512, level) * 1.025


def _sphere_product_rule():
    """(points, weights) of Gauss-Legendre in x3 (20 nodes) times the trapezoid in the azimuth (40): exact on S^2
    for polynomials of degree <= 39."""
    z, wz = np.polynomial.legendre.leggauss(20)
    phi = np.arange(40) * 2 * np.pi / 40
    Z, P = np.meshgrid(z, phi, indexing="ij")
    r = np.sqrt(1 - Z ** 2)
    x = np.stack([r * np.cos(P), r * np.sin(P), Z], axis=-1).reshape(-1, 3)
    return x, (wz[:, None] * np.full(40, 2 * np.pi / 40)[None, :]).ravel()


def test_token_law_amplitude_of_a_sample_and_its_ensemble_prediction():
    """validation/token_ensembles/law.py: (1) the perturbed f0's x1 x3 moment is eps / 30 and Var(x1 x3) = 1/15
    under the uniform measure, by a product rule exact for these polynomials (Gauss-Legendre in x3 times the
    trapezoid in the azimuth: degree <= 39), to rounding; (2) the ensemble prediction's mean and spread, the
    law evaluated at eps_eq = 30 mean(x1 x3) of uniform samples, against a Monte Carlo of 4000 samples of 500
    tokens: the tolerance 0.08 is 4.5 standard errors of the Monte Carlo mean (1.11 / sqrt(4000) = 0.018) plus
    the central limit's O(1/n) (a wrong factor in eps_eq of sqrt 2 moves the mean by 0.35, a wrong
    E log|Z| by 0.64)."""
    from spherepde.config import perturbed_uniform

    mod = C.load_study("token_ensembles")
    law = importlib.import_module("validation.token_ensembles.law")
    x, w = _sphere_product_rule()
    for eps in (0.05, 0.3):
        m13 = np.sum(w * x[:, 0] * x[:, 2] * perturbed_uniform(x, eps))
        assert abs(law.EQUIV * m13 - eps) < 1e-13
    assert abs(np.sum(w * (x[:, 0] * x[:, 2]) ** 2) / (4 * np.pi) - law.VAR13) < 1e-14

    rng = np.random.default_rng(7)
    a, b, n = 4.86, 1.0, 500
    t = np.array([a + b * np.log(1 / abs(law.eps_equivalent(mod.sample_uniform(n, 3, rng=rng)))) for _ in range(4000)])
    mean, sd = law.ensemble_prediction(n, a, b)
    assert abs(t.mean() - mean) < 0.08 and abs(t.std() - sd) < 0.08, (t.mean(), mean, t.std(), sd)


def test_token_law_stall_seed_and_the_two_stage_prediction():
    """validation/token_ensembles/law.py, t_EF: (1) the perturbed f0's first moment along e2 is eps / 3 and
    Var(x2) = 1/3 under the uniform measure (the same exact product rule as above, to rounding); (2) the
    two-stage prediction, exit law at 30 mean(x1 x3) plus stall law at 3 mean(x2), against a Monte Carlo of 4000
    samples of 500 tokens: its mean and spread to 0.11, 4.5 standard errors of the Monte Carlo mean (1.57 /
    sqrt(4000) = 0.025) plus the central limit's O(1/n). The spread checks that the two seeds are independent
    (fully correlated seeds would give 2.2, not 1.57); a stall amplitude without its factor 3 moves the mean by
    1.1; (3) per_seed_stall on runs made to follow a stall law exactly reads it back (correlation 1, its slope,
    its intercept, rms 0) and the whole prediction of t_EF with rms 0."""
    from spherepde.config import perturbed_uniform

    mod = C.load_study("token_ensembles")
    law = importlib.import_module("validation.token_ensembles.law")
    x, w = _sphere_product_rule()
    for eps in (0.05, 0.3):
        assert abs(law.EQUIV2 * np.sum(w * x[:, 1] * perturbed_uniform(x, eps)) - eps) < 1e-13
    assert abs(np.sum(w * x[:, 1] ** 2) / (4 * np.pi) - law.VAR2) < 1e-14

    rng = np.random.default_rng(11)
    a, b, c, b2, n = 3.4, 1.0, 3.1, 1.02, 500
    t = []
    for _ in range(4000):
        s = mod.sample_uniform(n, 3, rng=rng)
        t.append(a + b * np.log(1 / abs(law.eps_equivalent(s))) + c + b2 * np.log(1 / abs(law.eps_stall(s))))
    t = np.array(t)
    mean, sd, stage = law.ef_ensemble_prediction(n, a, b, c, b2)
    assert abs(t.mean() - mean) < 0.11 and abs(t.std() - sd) < 0.11, (t.mean(), mean, t.std(), sd)
    assert stage == law.ensemble_prediction(n, c, b2, law.EQUIV2, law.VAR2)[0]

    eps2 = np.geomspace(1e-3, 0.3, 12) * np.where(np.arange(12) % 2, 1, -1)
    eps13 = np.geomspace(0.02, 0.5, 12)[::-1]
    runs = [{"n": 1000, "eps_stall": e2, "eps_eq": e1, "m12": 0.01 * (i + 1), "m23": 0.02 / (i + 1),
             "t_exit": a + b * np.log(1 / e1), "t_EF": a + b * np.log(1 / e1) + c + b2 * np.log(1 / abs(e2))}
            for i, (e1, e2) in enumerate(zip(eps13, eps2))]
    q, = law.per_seed_stall(runs, [1000], a, b, (c, b2))
    assert q["runs"] == 12 and abs(q["corr"] - 1) < 1e-12 and abs(q["slope"] - b2) < 1e-12
    assert abs(q["intercept_at_slope"] - c) < 1e-12 and q["rms_law"] < 1e-12 and q["rms_t_EF"] < 1e-12


def test_stall_seed_shrinks_with_beta_and_sets_the_second_stage():
    """validation/token_ensembles/stall_seed.py on two of law.py's runs a beta (n = 200, seeds 0 and 1, beta 3 and
    30: seconds). The runs are law.json's own (t_exit, t_EF equal to rounding: the same draw, algorithm and field).
    The collapse shrinks the stall's seed mean(x2) more at the larger beta (stall_seed.md: r ~ 0.75 at beta 3, ~0.2
    at 30), and the second stage measured from the seed left at the exit, t_EF - t_exit - log(1 / |3 mean(x2)(t_exit)|),
    is the same at both betas to 0.4 (stall_seed.py's bar; measured within 0.05), while measured from the initial
    seed it differs by more than 0.8 (c grows 1.3 from beta 3 to 30): the stage's growth with beta is the seed's
    shrinking. Either would fail if the stall were seeded otherwise or the exit's seed were read at another time."""
    mod = importlib.import_module("validation.token_ensembles.stall_seed")
    law = json.loads((mod.HERE / "law.json").read_text())
    runs = [mod.one(beta, s, 200) for beta in (3.0, 30.0) for s in (0, 1)]
    per = mod.analyse(runs, law)
    assert [q["matched"] for q in per] == [2, 2] and all(q["max_time_difference"] <= 1e-9 for q in per)
    for s in (0, 1):
        lo, hi = (next(r for r in runs if r["beta"] == b and r["seed"] == s) for b in (3.0, 30.0))
        assert 0 < hi["r"] < 0.6 * lo["r"], (lo["r"], hi["r"])
        stage = [r["t_EF"] - r["t_exit"] for r in (lo, hi)]
        c0 = [g - math.log(1 / abs(3 * r["m2_exit"])) for g, r in zip(stage, (lo, hi))]
        c = [g - math.log(1 / abs(3 * r["m2_0"])) for g, r in zip(stage, (lo, hi))]
        assert abs(c0[1] - c0[0]) <= mod.SPREAD_BAR and c[1] - c[0] > 0.8, (c0, c)


def test_transition_law_beta300_on_disk_and_its_tokens(tmp_path):
    """adaptive_beta300.json and token_ensembles/law.json at beta 300 (transition_law/README.md, "At beta 300"):
    the exit is not the two-cluster law's. eps 0.5 converges (last step <= 2 %) at 15.9, within 5 % of Figure 4's
    converged eps 0.05 exit (16.43): a slope over the decade below 0.3 where the law has 1, and adaptive_betas.md
    leaves beta 300 out of a(beta) for it. Smaller eps come down level by level (eps 1e-3: every level below the
    last); after its departure from E every member joins one curve of align E against t (the stall's drift), so
    that at T = 30 every row's align E up to nside_max 512 lies within 0.01 of the others' (1024's eps 1e-2 ends above them,
    its eps 1e-3 among them, after an exit below the converged ones with its departure not converged). The tokens (n = 200 and 1000) keep the
    slope and sit at the intercept that a(beta) extrapolated along log(beta) from beta 30 and 100 gives (within
    0.3), more than 7 below the density law's a(300). The departure from E's plateau is the two-cluster law's: eps
    0.5's comes earlier level by level (5.85, 5.20, 5.05, 5.03 at nside_max 64-512, converged) and with Figure 4's
    converged eps 0.05 departure gives a slope in log(1 / eps) within 5 % of 1 / tanh(300) (measured 1.027), where
    the exits' is below 0.3; eps 1e-2's exit converges too (nside_max 1024), within 5 % of eps 0.05's, while its
    departure comes down onto that law from above (0.6 % over it at 1024). Every row to T = 30, mass to 1e-14, f >= 0."""
    import json
    import math

    from validation.fig4_concentration import adaptive as A
    from validation.fig4_concentration.adaptive import BAR
    from validation.transition_law import adaptive as mod

    rows = json.loads((mod.HERE / "adaptive_beta300.json").read_text())["rows"]
    assert all(r["t_end"] == 30.0 and r["mass_drift"] <= 1e-14 and r["min"] >= 0.0 for r in rows)
    a, b, eps0, t0, beta, anchor = mod._law(300.0, rows)
    assert (eps0, anchor["source"], anchor["nside_max"]) == (0.05, "fig4", 1024) and abs(t0 - 16.43) < 0.01
    by = {e: {r["nside_max"]: r for r in rows if r["eps"] == e} for e in {r["eps"] for r in rows}}
    conv = mod.converged(rows)
    t5 = conv[0.5][0]
    assert mod._step(by[0.5][64]["t_exit"], by[0.5][128]["t_exit"]) <= BAR["t_exit"]
    assert abs(t5 / t0 - 1) <= 0.05 and (t0 - t5) / math.log(0.5 / 0.05) < 0.3
    e3 = [by[1e-3][n]["t_exit"] for n in sorted(by[1e-3])]
    assert len(e3) >= 3 and all(x > y for x, y in zip(e3, e3[1:]))
    assert all(r["t_depart"] < r["t_exit"] for r in rows)
    final_E = [r["final_align"][0] for r in rows if r["nside_max"] <= 512]
    assert max(final_E) - min(final_E) <= 0.01
    # the 1024 level (eps 1e-2) follows that curve to t ~ 24 and ends above every other row at T (0.825 against
    # 0.813-0.817): the drift's late part is not converged in nside_max (README, "At beta 300")
    assert by[1e-2][1024]["final_align"][0] > max(final_E)
    # the departure (measured 2026-12-07): eps 0.5's against Figure 4's converged eps 0.05 departure (7.39, nside_max
    # 1024), one decade apart: the two-cluster slope 1 / tanh(beta), where the exits over the same decade move by 0.4.
    # eps 0.5's departure is converged on its ladder: 5.05 -> 5.03 from nside_max 256 to 512, the issue's 2 % bar
    d = json.loads((mod.HERE.parent / "fig4_concentration" / "adaptive.json").read_text())
    dep05 = A.leave_plateau(next(r for r in A.fallback_ladder(d["rows"], 300.0) if r["nside_max"] == 1024))
    dep5 = [by[0.5][n]["t_depart"] for n in sorted(by[0.5])]
    assert sorted(by[0.5]) == [64, 128, 256, 512] and all(x > y for x, y in zip(dep5, dep5[1:]))
    assert mod._step(dep5[-2], dep5[-1]) <= BAR["t_exit"]
    assert abs((dep05 - dep5[-1]) / math.log(0.5 / 0.05) * math.tanh(300.0) - 1) <= 0.05
    # eps 1e-2 (nside_max 512 and 1024 measured 2026-12-07): its exit converges (15.98 -> 16.08, 0.6 %) within 5 %
    # of eps 0.05's, and its departure comes down onto the law from above level by level (15.63, 13.44, 11.12,
    # 9.46, 9.06 at 64-1024; the law with Figure 4's converged eps 0.05 departure: 7.39 + log 5 = 9.00; 1024's is
    # 0.6 % over it, within 2 %, though its last step, 4.5 %, is not within the bar)
    e2 = [by[1e-2][n] for n in sorted(by[1e-2])]
    assert sorted(by[1e-2])[-1] == 1024 and mod._step(e2[-2]["t_exit"], e2[-1]["t_exit"]) <= BAR["t_exit"]
    assert abs(e2[-1]["t_exit"] / t0 - 1) <= 0.05
    dep2, law2 = [r["t_depart"] for r in e2], dep05 + math.log(0.05 / 1e-2) / math.tanh(300.0)
    assert all(x > y for x, y in zip(dep2, dep2[1:])) and 0 < dep2[-1] - law2 <= 0.02 * law2, (dep2, law2)
    # eps 1e-3 at nside_max 1024 (measured 2026-12-07): its departure comes down again (16.85, 14.97, 12.64 at
    # 256-1024), still 12 % over the law (7.39 + log 50 = 11.30: not converged), its exit, 15.05, lies below the
    # converged exits (~16), and at T it is back on the shared curve (align E 0.814 against 0.813-0.817)
    e3r = [by[1e-3][n] for n in sorted(by[1e-3])]
    dep3, law3 = [r["t_depart"] for r in e3r], dep05 + math.log(0.05 / 1e-3) / math.tanh(300.0)
    assert sorted(by[1e-3])[-1] == 1024 and all(x > y for x, y in zip(dep3, dep3[1:]))
    assert dep3[-1] - law3 > 0.02 * law3 and mod._step(dep3[-2], dep3[-1]) > BAR["t_exit"]
    assert e3r[-1]["t_exit"] < min(conv[e][0] for e in (0.5, 1e-2))
    assert min(final_E) - 0.01 <= e3r[-1]["final_align"][0] <= max(final_E) + 0.01
    text = "\n".join(mod.write_betas(path=tmp_path / "adaptive_betas.md"))
    assert "beta 300 is left out of a(beta)" in text and "from beta 30 to 100" in text and "to 300:" not in text

    law = json.loads((mod.HERE.parent / "token_ensembles" / "law.json").read_text())
    got = {r["beta"]: r["law"]["a"] for r in law["betas"]}
    tok = next(r for r in law["betas"] if r["beta"] == 300.0)
    extrap = got[100.0] + (got[100.0] - got[30.0]) / math.log(100 / 30) * math.log(3.0)
    for q in tok["per_seed"]:
        icpt = tok["law"]["a"] + q["mean_law_error"]
        assert abs(icpt - extrap) <= 0.3 and tok["law"]["a"] - icpt > 7.0, (q["n"], icpt, extrap)
        assert 0.3 < q["slope"] < 1.5  # the tokens' exits grow with log(1 / |eps_eq|)


def test_collapse_closed_forms_are_the_moment_equations_integrals_and_the_particles_follow_them():
    """validation/cluster_dynamics/collapse.py: the shrink factors of the two seeds, r(beta) = (1 + 2 beta / 3)^(-1/2)
    and R(beta) = (1 + beta)^(-2/3), are the integrals of the Gaussian-cluster moment equations (integrated here in
    time, not through the change of variable of the closed forms), and the collapse of the perturbed f0 as 768
    weighted particles (nside 8; seconds) leaves its seeds at those fractions, with the formula's dependence on
    beta over a decade (beta 10 and 100)."""
    mod = importlib.import_module("validation.cluster_dynamics.collapse")
    for beta in (3.0, 30.0, 300.0):
        r, R = mod.moment_ode(beta)
        # RK45 at rtol 1e-11 over T = 40; the closed forms are exact
        assert abs(r / mod.translation_shrink(beta) - 1) < 1e-7 and abs(R / mod.rotation_shrink(beta) - 1) < 1e-7
    runs = [mod.collapse_run(beta, 8) for beta in (10.0, 100.0)]
    lr = np.array([[math.log(q["r"] / q["r_closed"]), math.log(q["R"] / q["R_closed"])] for q in runs])
    # the study's bars (collapse.py: ABS_BAR a fifth of an e-fold with no fitted constant; SPREAD_BAR a tenth of
    # the range of log r and log R over the betas); over beta 10 -> 100 log r changes by 1.0 and log R by 1.5, so
    # a wrong exponent (r ~ 1 / beta, R ~ beta^-1) would miss by more than 0.5
    assert np.all(np.abs(lr) <= mod.ABS_BAR), lr
    assert np.all(np.abs(lr[1] - lr[0]) <= mod.SPREAD_BAR), lr
    # the seeds are read after the widths have fallen far below the attention scale (s^2 << 1 at T)
    assert all(q["s2sq"][-1] < 0.1 and q["s3sq"][-1] < 0.1 for q in runs)


def test_transition_law_stall_lag_on_grid_limited_clusters_on_disk():
    """transition_law/README.md, "The stall runs 3-4 % slow on grid-limited clusters" (record stall_refined.json:
    beta 30, eps 1e-3, the nside-32-base members at nside_max 2048 and 4096, and restarts of the 4096 state).
    Asserted: (1) the restart at the member's own level gives its t_exit and t_EF back (1e-4); (2) t_exit agrees
    on every level to 0.2 % and t_EF converges (each within the issue's 2 % of the next finer); (3) on every level
    the stall's seed mean(x2) grows at < 0.975 over t = 13-17 where the exact rate int f v2 / mean(x2) at t = 16 is
    >= 0.995: a lag of 0.1-0.2 time units, and t_EF less it agrees on the 4096-based levels to 0.02 (it would not
    if the lag were noise); (4) it is not the step (cfl 0.2, rtol 1e-6: 1e-3), nor the field's extrapolation
    (recomputed every step: 1e-3), nor the regrids (a static grid: 1e-3),
    nor the exact rate's quadrature (the states' reconstructions on 4x and 16x finer cells: 3e-4), and the
    state's cells refined 4x grow at > 0.99, as does the diffusive upwind scheme; (5) the exit's seed on E is
    carried at its exact rate (0.6 %)."""
    from validation.transition_law import stall_refined as S

    rec = json.loads((C.VALID / "transition_law" / "stall_refined.json").read_text())
    src, lv, ch = rec["sources"], rec["levels"], rec["checks"]
    own = lv["4096_t8_4096"]
    for key in ("t_exit", "t_EF"):
        assert abs(own[key] / src["4096"][key] - 1) <= 1e-4, key
    ladder = [src["2048"], src["4096"], lv["4096_t8_8192"], lv["4096_t12.5_16384"]]
    assert max(q["t_exit"] for q in ladder) / min(q["t_exit"] for q in ladder) - 1 <= 0.002
    assert all(abs(a["t_EF"] / b["t_EF"] - 1) <= 0.02 for a, b in zip(ladder, ladder[1:]))
    exact = [src["2048"]["states"]["16"]["exact_rate"], src["4096"]["states"]["16"]["exact_rate"]] + \
        [lv[k]["at16"]["exact_rate"] for k in ("4096_t8_8192", "4096_t12.5_16384")]
    lags = [S.lag(q, e) for q, e in zip(ladder, exact)]
    assert all(q["rate"] < 0.975 for q in ladder) and min(exact) >= 0.995
    assert all(0.1 <= g <= 0.2 for g in lags), lags
    fixed = [q["t_EF"] - g for q, g in zip(ladder[1:], lags[1:])]
    assert max(fixed) - min(fixed) <= 0.02 and max(fixed) < min(q["t_EF"] for q in ladder) - 0.1
    step = ch["step"]
    assert max(abs(step[k] - step["cfl 0.8"]) for k in ("cfl 0.2", "rtol 1e-6", "field every step")) <= 1e-3
    assert abs(ch["static_1.5"] - ch["adaptive_1.5"]) <= 1e-3 and ch["adaptive_1.5"] < 0.97
    assert ch["refined16384_1.5"] > 0.99
    # the diffusive upwind scheme (wider clusters) is nearer the exact rate than the linear one, the quadratic farther
    assert ch["schemes"]["upwind"] > step["cfl 0.8"] + 0.03 > ch["schemes"]["quadratic"] + 0.03
    for key, rate in ch["exact_on_finer"].items():
        t = key.split(",")[0].split()[1]
        assert abs(rate - src["4096"]["states"][t]["exact_rate"]) <= 3e-4, key
    assert all(abs(q["scheme"] - q["exact"]) <= 0.006 for q in ch["exit_seed"].values())


def test_second_seed_on_disk_is_the_tails():
    """transition_law/second_seed.json (README, "The second seed at the exit is the tails'"): Figure 4's beta 100
    setting with f0's odd part b x2 set apart. The config is the perturbed f0 for b = eps (checked at random points
    against spherepde.config.perturbed_uniform) and its even part for b = 0. On every level: with b = 0, mean(x2)
    stays at round-off (<= 1e-12: the scheme keeps the x -> -x symmetry the equation has, so no seed is the
    grid's); with b = eps / 10 the excursion after the exit is at least as large as with b = eps (not the
    linear response of the seed, which would be 10x smaller); and at the exit, where the drift d mean(x2)/dt is
    at least 10x its pre-exit size, the cells holding below 1e-6 of the heaviest cell's mass (<= 1e-5 of the
    mass) carry it: without them the drift is at least 10x smaller or of the other sign. With the tails on nside 64
    base cells the kick is the same. Mass to 1e-14."""
    import json

    import numpy as np

    from spherepde.config import parse_config, perturbed_uniform
    from validation.transition_law import second_seed as mod

    x = np.random.default_rng(3).normal(size=(200, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    f = parse_config(mod.config(128, mod.EPS, 11.0)).initial.density(3)
    assert np.allclose(f(x), perturbed_uniform(x, mod.EPS), rtol=1e-14, atol=0)
    even = parse_config(mod.config(128, 0.0, 11.0)).initial.density(3)
    assert np.allclose(even(x), even(-x), rtol=1e-14, atol=0) and not np.allclose(f(x), f(-x), rtol=1e-3)
    assert mod.run_name(256, 0.005) == "seed_256_b01" and mod.run_name(256, 0.0) == "seed_256_b0"

    every = json.loads((mod.HERE / "second_seed.json").read_text())
    rec = {k: r for k, r in every.items() if r.get("nside_min", mod.NSIDE_MIN) == mod.NSIDE_MIN}
    levels = sorted({r["nside_max"] for r in rec.values()})
    assert levels == [128, 256] and len(rec) == 6
    for n in levels:
        by = {r["b"]: r for r in rec.values() if r["nside_max"] == n}
        assert all(r["mass_drift"] <= 1e-14 for r in by.values())
        assert max(abs(row["mean_x2"]) for row in by[0.0]["rows"]) <= 1e-12
        late = {b: max(abs(row["mean_x2"]) for row in r["rows"] if row["t"] >= r["t_exit"] + 0.5)
                for b, r in by.items() if b}
        assert late[0.005] >= late[0.05]
        for b in (0.005, 0.05):
            d = by[b]["drift"]
            pre = abs(d[0]["0"]["drift"])  # t_exit - 0.25
            kicked = [e for e in d if abs(e["0"]["drift"]) >= 10 * pre]
            assert kicked, (n, b)
            for e in kicked:
                full, clusters = e["0"]["drift"], e["1e-06"]["drift"]
                assert e["1e-06"]["left_out"] <= 1e-5
                assert abs(clusters) <= 0.1 * abs(full) or clusters * full < 0, (n, b, e["t"])
    # the tails on nside 64 base cells: the same kick (the swing's extreme and the drift 0.25 after the exit
    # within 10 %; measured 4 % and 3 %), so the coarse cells that carry the tails do not set it
    fine = every[mod.run_name(256, 0.005, 64)]
    base = rec[mod.run_name(256, 0.005)]
    assert fine["nside_min"] == 64 and fine["mass_drift"] <= 1e-14
    swing = [min(row["mean_x2"] for row in r["rows"]) for r in (fine, base)]
    assert swing[0] < 0 and abs(swing[0] / swing[1] - 1) <= 0.1
    kick = [next(e for e in r["drift"] if e["t"] >= r["t_exit"] + 0.2)["0"]["drift"] for r in (fine, base)]
    assert abs(kick[0] / kick[1] - 1) <= 0.1
