"""How the error control fares on Figure 4's adaptive runs: steps, rejected attempts, tiny steps, wall time.

The adaptive Figure 4 levels (``validation/fig4_concentration/adaptive.py``: beta 30, eps 0.05, T = 30,
the study's base configuration) are run again with the current code into ``sweep_runs/`` beside this file
(not committed; a finished level is loaded, not rerun), and each level's step statistics are read from its
results file's per-step diagnostics: accepted steps, rejected attempts (and their share of all attempts),
the most rejections before one step, the steps shorter than 1e-5, the shortest step, and the solver's wall
time; beside them the study's readings (t_exit, t_EF, plateau W2, the departure time and the drift), so that
a change of the stepping can be seen not to move them. ``--compare ROOT`` adds the same levels as found
(finished) under another root of sweep directories, e.g. the study's own
``validation/fig4_concentration/sweep_runs``, run with an earlier code; nothing is run there.

Usage: python validation/time_accuracy/fig4_steps.py [--levels 64:att:16 128:att:16 64:default:16 512:att:16]
[--compare ROOT]   (writes fig4_steps.md and fig4_steps.json beside this file)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validation" / "fig4_concentration"))

LEVELS = ["64:att:16", "128:att:16", "64:default:16", "512:att:16"]


def step_stats(sweep_dir: Path) -> dict:
    """The per-step statistics of the (single) member of a sweep directory."""
    import h5py

    files = sorted(Path(sweep_dir).glob("members/*/results.h5"))
    if not files:
        raise FileNotFoundError(f"no results file under {sweep_dir}/members/")
    with h5py.File(files[0], "r") as h:
        d = h["diagnostics"]
        rej, dt = np.asarray(d["rejected"][:], float), np.asarray(d["dt"][:], float)
    steps, rejected = int(rej.size), int(rej.sum())
    return {"steps": steps, "rejected": rejected, "rejected_share": rejected / (steps + rejected),
            "max_rejected": int(rej.max()), "steps_below_1e-5": int((dt[dt > 0] < 1e-5).sum()),
            "min_dt": float(dt[dt > 0].min())}


def run_level(spec: str, root: Path | None = None) -> dict | None:
    """One level's row: run (or loaded) under sweep_runs/ here, or only loaded under ``root``."""
    import adaptive as A

    nmax, ref, nmin = spec.split(":")
    A.RUNS = HERE / "sweep_runs" if root is None else Path(root).resolve()
    rec = A.member(30.0, int(nmax), run=root is None, nside_min=int(nmin), attended=ref == "att")
    if rec is None:
        return None
    name = A.spec(30.0, int(nmax), int(nmin), ref == "att").name
    return {"level": spec, "dir": str((A.RUNS / name).relative_to(ROOT)), **step_stats(A.RUNS / name),
            "wall_s": rec["wall_s"], "t_exit": rec["t_exit"], "t_EF": rec["t_EF"], "plateau_w2": rec["plateau_w2"],
            **A.terminal(rec)}


def fmt(v, spec=".4g"):
    return "" if v is None else format(v, spec)


def write_md(rows: list[dict]) -> str:
    lines = ["# Figure 4's adaptive levels: how the error control steps (validation/time_accuracy/fig4_steps.py)", "",
             "beta 30, eps 0.05, T = 30, the study's base configuration (rtol 1e-3, cfl 0.8, field every <= 10 steps); "
             "level = nside_max:refinement:nside_min. Rejected share: of all attempts.", "",
             "| level | run | steps | rejected | share | most before one step | steps < 1e-5 | shortest step | wall s | "
             "t_exit | t_EF | plateau W2 | t_depart | drift |", "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['level']} | {r['dir']} | {r['steps']} | {r['rejected']} | {r['rejected_share']:.0%} | "
                     f"{r['max_rejected']} | {r['steps_below_1e-5']} | {r['min_dt']:.1e} | {fmt(r.get('wall_s'), '.0f')} | "
                     f"{fmt(r.get('t_exit'), '.5f')} | {fmt(r.get('t_EF'), '.3f')} | {fmt(r.get('plateau_w2'), '.5f')} | "
                     f"{fmt(r.get('t_depart'), '.3f')} | {fmt(r.get('drift'), '.4f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", nargs="*", default=LEVELS, help="nside_max:att|default:nside_min")
    ap.add_argument("--compare", default=None, help="a root of sweep directories to report the levels of beside")
    a = ap.parse_args(argv)
    rows = [run_level(s) for s in a.levels]
    if a.compare:
        rows += [r for r in (run_level(s, a.compare) for s in a.levels) if r is not None]
    md = write_md(rows)
    (HERE / "fig4_steps.json").write_text(json.dumps(rows, indent=1))
    (HERE / "fig4_steps.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
