"""The mean-field equation's own distance from the particle picture: each narrow cluster as a cloud of
weighted tokens (README, "What the bar leaves to the discretisation").

Each of the three clusters of ``run.py`` becomes N tokens with antithetic Gaussian tangent offsets of
per-axis width w around its centre (so each cloud's weighted centroid starts exactly on its particle),
carrying the cluster's mass in equal weights; the clouds stand for the exact PDE solution. Printed: per
check time, each cloud's centroid distance from its particle (``run.particles``) and its rms angular
width.

Usage: python validation/adaptive_clusters/clouds.py [N] [w]   (default 400 tokens, w = 0.003; ~15 s)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import spherepde as sp  # noqa: E402
from validation.adaptive_clusters import run as R  # noqa: E402


def clouds(n: int = 400, w: float = R.WIDTH, dt: float = 2e-3, seed: int = 0):
    rng = np.random.default_rng(seed)
    model = sp.Attention(np.diag([-1.0, -1.0, 1.0]), np.diag([-1.0, 1.0, -2.0]), R.BETA)
    centres = R.CENTRES / np.linalg.norm(R.CENTRES, axis=1)[:, None]
    X, W, lab = [], [], []
    for k, (c, m) in enumerate(zip(centres, R.MASSES)):
        e = rng.normal(size=(n // 2, 3))
        e = np.vstack([e, -e])
        e -= (e @ c)[:, None] * c
        x = c + w * e
        X.append(x / np.linalg.norm(x, axis=1)[:, None])
        W += [m / len(x)] * len(x)
        lab += [k] * len(x)
    X, W, lab = np.vstack(X), np.array(W), np.array(lab)
    save = np.array((0.0,) + R.CHECK_TIMES)
    P = sp.simulate_particles(model, X, R.T, dt, save_at=save, method="rk4", weights=W).positions
    ref = R.particles(R.T, save)
    rows = []
    for i, t in enumerate(save):
        err, wid = [], []
        for k in range(3):
            s = lab == k
            c = (W[s, None] * P[i][s]).sum(0)
            c /= np.linalg.norm(c)
            err.append(float(np.arccos(np.clip(c @ ref[i][k], -1, 1))))
            ang = np.arccos(np.clip(P[i][s] @ c, -1, 1))
            wid.append(float(np.sqrt((W[s] * ang ** 2).sum() / W[s].sum())))
        rows.append((float(t), err, wid))
    return rows


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    w = float(sys.argv[2]) if len(sys.argv) > 2 else R.WIDTH
    for t, err, wid in clouds(n, w):
        print(f"t = {t:g}: centroid - particle {['%.2e' % e for e in err]} rad, rms width {['%.2e' % x for x in wid]}")
