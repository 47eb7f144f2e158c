"""W2 between the nside 16 and nside 32 PDE densities of this study (an estimate of the PDE
discretisation error that enters W2(PDE, particles)). Both grid densities are merged onto the same
HEALPix nside 16 pixels (mass-weighted centroids, `coarsen_measure`, size 3072) so the LP is 3072 x 3072.
Writes pde_resolution.json. Usage: python validation/pde_vs_particles/pde_resolution.py [--times 0 1 2]"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

import spherepde as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from validation import datafile  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--times", type=float, nargs="+", default=[0, 1, 2, 3, 4, 5])
ap.add_argument("--coarse", default="nside16", help="folder (relative to this one) of the coarser run")
ap.add_argument("--fine", default=".", help="folder of the finer run")
ap.add_argument("--name", default="pde_resolution.json")
a = ap.parse_args()
p32, p16 = datafile.load(HERE / a.fine / "raw_pde.nc"), datafile.load(HERE / a.coarse / "raw_pde.nc")
out_f = HERE / a.name
out = json.loads(out_f.read_text()) if out_f.exists() else {}
for t in a.times:
    i32, i16 = int(np.argmin(abs(p32["times"] - t))), int(np.argmin(abs(p16["times"] - t)))
    c32, w32, d32 = sp.coarsen_measure(p32["centers"], p32["density"][i32] * p32["areas"], 3072)
    c16, w16, d16 = sp.coarsen_measure(p16["centers"], p16["density"][i16] * p16["areas"], 3072)
    w2 = sp.wasserstein2(c32, w32, c16, w16)
    out[f"{t:g}"] = {"W2_nside16_vs_32" if a.name == "pde_resolution.json" else "W2": w2, "displacement_32": d32, "displacement_16": d16}
    out_f.write_text(json.dumps(out, indent=1))
    print(f"t = {t:g}: W2(PDE {a.coarse}, PDE {a.fine}) = {w2:.4f} (merge displacements {d32:.4f}, {d16:.4f})", flush=True)
