"""Benchmark of the particle simulation: seconds per time step at n = 10^4 tokens.

Setting of the paper (arXiv:2605.10931, Section 5): d = 3, B = diag(-1, -1, 1), V = diag(-1, 1, -2),
beta = 100, tokens uniform on S^2, dt = 0.01; schemes "euler" (Algorithm 1, one softmax evaluation per
step) and "rk4" (four). Also the hardmax rule and the zero-temperature rule (Algorithm 2, O(n)).
Writes ``validation/bench_particles.md`` and prints it.

Usage: ``python validation/bench_particles.py [--n 10000] [--steps 3]``
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numba
import numpy as np

from spherepde.models import ZeroTemperature
from spherepde.particles import simulate_particles
from spherepde.sampling import sample_uniform

B = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
BETA = 100.0
DT = 0.01


def attention_model(beta):
    try:
        from spherepde.models.attention import Attention

        return Attention(B, V, beta)
    except ImportError:  # the particle code only reads B, V, beta
        class _Att:
            pass

        m = _Att()
        m.B, m.V, m.beta, m.dim = B, V, beta, 3
        return m


def per_step(model, x0, method, steps, hardmax=False):
    simulate_particles(model, x0[:64], DT, DT, method=method, hardmax=hardmax)  # compile / warm caches
    t0 = time.perf_counter()
    res = simulate_particles(model, x0, steps * DT, DT, method=method, hardmax=hardmax)
    dt = time.perf_counter() - t0
    assert res.n_steps == steps
    return dt / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    x0 = sample_uniform(args.n, 3, rng=0)
    att = attention_model(BETA)
    rows = [
        ("softmax (beta = 100)", "euler", per_step(att, x0, "euler", args.steps), 1),
        ("softmax (beta = 100)", "rk4", per_step(att, x0, "rk4", args.steps), 4),
        ("hardmax", "euler", per_step(att, x0, "euler", args.steps, hardmax=True), 1),
        ("zero temperature (Algorithm 2)", "euler",
         per_step(ZeroTemperature(B, V), x0, "euler", args.steps), 1),
        ("zero temperature (Algorithm 2)", "rk4", per_step(ZeroTemperature(B, V), x0, "rk4", args.steps), 4),
    ]
    lines = [
        "# Particle benchmark: seconds per time step",
        "",
        f"n = {args.n} tokens, d = 3, paper matrices B = diag(-1,-1,1), V = diag(-1,1,-2), dt = {DT}, "
        f"mean of {args.steps} steps after warm-up.",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"numba {numba.__version__} with {numba.get_num_threads()} threads; load average at the end "
        f"{os.getloadavg()[0]:.1f} (timings scale with competing load).",
        "",
        "| rule | method | field evaluations / step | s / step |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r} | {m} | {k} | {s:.3f} |" for r, m, s, k in rows]
    lines += ["", "The softmax rule is O(n^2 d) per evaluation (no n x n array); Algorithm 2 is O(n d).", ""]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_particles.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
