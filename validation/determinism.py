"""Determinism (issue #21 items 4-5): fresh processes and thread counts give bitwise identical results.

Each *case* is a short run on one evaluation path of the field: zero temperature, direct, pruned, the
in-house spectral series, the fast spectral path (ducc0) on HEALPix sources and on a tensor grid (general
sources: the NUFFT), ``method="auto"`` at the default tol 1e-12, and particles (softmax over 3000 tokens).
A worker process runs every case and writes the final densities / positions; the driver starts fresh
workers (10 at the default thread count and 3 at one Numba thread, by default) and compares them bit
for bit.

The promise (documented in docs/user_guide.md): identical bits in every process, and for any thread
count, on every path. What makes it hold: every parallel sum has a fixed partition (sph_coeffs: 16 fixed
partial sums; the fast path: fixed groups of basis maps per bin, added in order; the NUFFT adjoint for
general sources on one thread); per-target kernels need none. And two compiler effects are kept out:
sph_coeffs' moments varied between fresh processes on identical inputs (4 distinct results in 12 at one
thread; likely a reduction loop that also stores, vectorised behind a run-time alias check on the buffers'
addresses), so its reductions now read only; and 'reassoc' with 'contract' made the cached sph_eval differ from
the one compiled in the process, so the elementwise kernels drop 'reassoc'. ``--fresh-cache`` checks the
latter (the first worker compiles, the others load).

Usage: ``python validation/determinism.py [--runs 10] [--runs-1thread 3] [--cases a,b]``; writes
validation/determinism.md (and .json). ``--worker DIR`` is the worker (internal).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

P = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
MU = np.array([1.0, 1.0, 0.0]) / np.sqrt(2.0)


def _two_caps(g, kappa=8.0):
    x = g.centers @ MU
    return kappa / (4 * np.pi * np.sinh(kappa)) * (np.exp(kappa * x) + np.exp(-kappa * x))


def _solve(nside, model, t_end, f0=None):
    import spherepde as sp

    g = sp.HealpixGrid(nside)
    f = _two_caps(g) if f0 is None else f0(g)
    used = []
    r = sp.solve(g, model, f, t_end, save_at=[0.0, t_end / 2, t_end], callback=lambda s: used.append(_path(s)))
    return {"density": r.density, "path": used[-1] if used else ""}


def _path(solver) -> str:
    """The methods of the solver's last attention evaluation ("" for a local model)."""
    info = solver.field_info
    return "" if info is None else "/".join(info.methods)


def case_zero_temperature():
    import spherepde as sp
    return _solve(8, sp.ZeroTemperature(P, V), 1.0)


def case_direct():
    import spherepde as sp
    return _solve(8, sp.Attention(P, V, 5.0, method="direct"), 0.5)


def case_pruned():
    import spherepde as sp
    return _solve(16, sp.Attention(P, V, 50.0, method="pruned"), 0.1)


def case_spectral_inhouse():
    import spherepde as sp
    return _solve(32, sp.Attention(P, V, 5.0, method="spectral"), 0.05)


def case_spectral_fast():
    import spherepde as sp
    return _solve(32, sp.Attention(P, V, 30.0, tol=1e-10, method="spectral"), 0.02)


def case_auto_default_tol():
    import spherepde as sp
    return _solve(32, sp.Attention(P, V, 100.0), 0.01, f0=lambda g: 1.0 + 0.2 * g.centers[:, 0] * g.centers[:, 1])


def case_tensor_fast():
    """The fast path on general (non-HEALPix) sources: ducc0's NUFFT adjoint."""
    import spherepde as sp

    g = sp.TensorGrid(3, 40)
    model = sp.Attention(P, V, 30.0, tol=1e-10, method="spectral")
    used = []
    r = sp.solve(g, model, _two_caps(g), 0.05, save_at=[0.0, 0.05], callback=lambda s: used.append(_path(s)))
    return {"density": r.density, "path": "tensor " + (used[-1] if used else "")}


def case_particles():
    import spherepde as sp

    x0 = sp.sample_vmf(3000, MU, 8.0, rng=7)
    model = sp.Attention(P, V, 30.0, tol=1e-10)
    r = sp.simulate_particles(model, x0, 0.05, 0.01)
    return {"density": r.positions, "path": "particles (softmax over tokens)"}


CASES = {k[5:]: v for k, v in dict(globals()).items() if k.startswith("case_")}


def worker(out: Path, names):
    res = {}
    for name in names:
        t0 = time.perf_counter()
        r = CASES[name]()
        np.save(out / f"{name}.npy", np.asarray(r["density"]))
        res[name] = {"sha256": hashlib.sha256(np.ascontiguousarray(r["density"]).tobytes()).hexdigest(),
                     "path": r["path"], "wall": time.perf_counter() - t0}
    (out / "hashes.json").write_text(json.dumps(res))


def start(names, threads, work: Path, tag: str, cache_dir=None):
    d = work / tag
    d.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    if threads is not None:
        env["NUMBA_NUM_THREADS"] = str(threads)
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(d), "--cases", ",".join(names)],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"worker {tag} failed: {p.stderr[-2000:]}")
    return d, json.loads((d / "hashes.json").read_text())


def compare(names, runs: int, runs1: int, work: Path, fresh_cache: bool = False) -> dict:
    """Per case: distinct hashes over the default-thread runs, over the 1-thread runs, and the max abs
    difference between the two (0.0 when identical). With ``fresh_cache`` every worker uses one new,
    empty Numba cache: the first compiles the kernels, the others load them."""
    cache = (work / "numba_cache") if fresh_cache else None
    default = [start(names, None, work, f"default_{i}", cache) for i in range(runs)]
    single = [start(names, 1, work, f"one_{i}", cache) for i in range(runs1)]
    out = {}
    for name in names:
        hd = {h[name]["sha256"] for _, h in default}
        h1 = {h[name]["sha256"] for _, h in single}
        a = np.load(default[0][0] / f"{name}.npy")
        b = np.load(single[0][0] / f"{name}.npy") if single else a
        out[name] = {"path": default[0][1][name]["path"], "distinct_default": len(hd), "distinct_1thread": len(h1),
                     "same_across_threads": hd == h1 if single else None,
                     "max_diff_1_vs_default": float(np.abs(a - b).max()),
                     "wall_s": float(np.median([h[name]["wall"] for _, h in default]))}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--runs-1thread", type=int, default=3)
    ap.add_argument("--fresh-cache", action="store_true",
                    help="one new Numba cache for all workers: the first compiles, the others load")
    a = ap.parse_args(argv)
    names = [c for c in a.cases.split(",") if c]
    unknown = set(names) - set(CASES)
    if unknown:
        ap.error(f"--cases: unknown {sorted(unknown)}; allowed: {', '.join(CASES)}")
    if a.worker is not None:
        worker(a.worker, names)
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = compare(names, a.runs, a.runs_1thread, Path(tmp), a.fresh_cache)
    wall = time.perf_counter() - t0
    import numba

    lines = ["# Determinism (issue #21 items 4-5)", "",
             f"`python validation/determinism.py --runs {a.runs} --runs-1thread {a.runs_1thread}"
             f"{' --fresh-cache' if a.fresh_cache else ''}`: {a.runs} fresh "
             f"processes at the default thread count ({numba.config.NUMBA_NUM_THREADS}) and {a.runs_1thread} at one "
             f"Numba thread, {wall:.0f} s. Bitwise: the final densities (particles: positions) as bytes."
             + (" One new, empty Numba cache for all: the first process compiles every kernel, the others load "
                "them from the cache (the two gave different bits before the fixes)." if a.fresh_cache else ""), "",
             "| case | path | distinct results, default threads | distinct, 1 thread | 1 thread = default | "
             "max abs diff | wall per run (s) |", "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['path']} | {r['distinct_default']} of {a.runs} | {r['distinct_1thread']} of "
                     f"{a.runs_1thread} | {r['same_across_threads']} | {r['max_diff_1_vs_default']:.3g} | "
                     f"{r['wall_s']:.2f} |")
    ok = all(r["distinct_default"] == 1 and r["distinct_1thread"] <= 1 and r["same_across_threads"] in (True, None)
             for r in res.values())
    lines += ["", "All identical." if ok else "**NOT all identical** (see the table)."]
    (HERE / "determinism.md").write_text("\n".join(lines) + "\n")
    (HERE / "determinism.json").write_text(json.dumps({"wall_s": wall, "cases": res}, indent=1))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
