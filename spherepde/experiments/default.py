"""The default experiment (``make run``): the paper's setting at a modest resolution.

A. Alcalde, L. Bungert, K. Riedl, T. Roith, "Quantifying concentration phenomena of mean-field
transformers in the low-temperature regime", arXiv:2605.10931, Section 5: d = 3,
B = diag(-1, -1, 1), V = diag(-1, 1, -2), beta = 100, uniform initial tokens, T = 20.

It runs ``docs/examples/paper_attention.toml`` through the same path as ``spherepde run`` (so the CLI
and ``make run`` share one configuration): HEALPix nside 16, the finite-beta model with the
particle overlay of Algorithm 1 (n = 200, dt = 0.01), and writes into ``--output``:
``results.h5``, ``figures/`` (maps at a few times, diagnostics against time, W2 to Pi#rho_0 and the
alignment with E and F for the PDE and the particles, an orthographic GIF with the tokens) and
``timing.json`` (the measured wall times). Interrupted, it resumes from its checkpoint when rerun.

Usage::

    python -m spherepde.experiments.default --output output/default [--config FILE] [--restart]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

# On a shared or loaded machine, GNU OpenMP's active spin-waiting makes every Numba parallel region wait
# for a descheduled thread: measured 10x slower per step at nside 16 (load 6 on 2 cores). Passive waiting
# costs nothing when idle. Must be set before the first parallel launch; the user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["CONFIG", "main"]

log = logging.getLogger(__name__)

#: The configuration file of the default experiment (packaged: ``spherepde/examples``, the source tree's
#: ``docs/examples``).
CONFIG = Path(__file__).resolve().parents[1] / "examples" / "paper_attention.toml"


def main(argv=None) -> int:
    from ..config import load_config
    from ..runner import run_experiment

    p = argparse.ArgumentParser(prog="python -m spherepde.experiments.default", description=__doc__.split("\n")[0])
    p.add_argument("--output", "-o", default="output/default", help="results directory")
    p.add_argument("--config", default=str(CONFIG), help="experiment file (default: %(default)s)")
    p.add_argument("--restart", action="store_true", help="ignore an existing run in the output directory")
    args = p.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("spherepde").setLevel(logging.INFO)
    cfg_path = Path(args.config)
    if not cfg_path.is_file():
        log.error("configuration not found: %s", cfg_path)
        return 2
    cfg = load_config(cfg_path)
    out = Path(args.output)
    t0 = time.perf_counter()
    result = run_experiment(cfg, out, restart=args.restart, progress=True, figures=True)
    total = time.perf_counter() - t0
    timing = {"total_wall_s": round(total, 2), "solver_wall_s": round(result.wall_time, 2),
              "n_steps": result.n_steps, "n_cells": result.grid.n_cells, "config": str(cfg_path)}
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    c = result.metadata.get("concentration") or {}
    if c:
        log.info("t = %g: W2 to Pi#rho_0 = %.3g, alignment E = %.3f, F = %.3f", result.times[-1],
                 c["w2_limit"][-1], c["alignment_E"][-1], c["alignment_F"][-1])
    log.info("default experiment: %s (solver %.1f s, total %.1f s)", out, result.wall_time, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
