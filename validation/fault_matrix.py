"""Fault-injection matrix (issue #21): kills, corrupted files, concurrent runs, planted links, full disks.

Every trial runs the real command line (``python -m spherepde.cli run``) in a fresh process and compares
the finished run with an uninterrupted reference run of the same configuration, bit for bit: the saved
times, every saved density, every per-step diagnostic, the step count and the concentration and particle
groups (wall times and creation dates excluded). A trial's outcome is one of

* ``identical``   the rerun completed and equals the reference bit for bit;
* ``clear error`` the command stopped with a non-zero status and one line on stderr (no traceback);
* ``refused``     (live directory, planted links) exit 2 with one line, nothing outside the directory written;
* ``WRONG``       a completed run that differs from the reference, or a damaged file read back as data;
* ``TRACEBACK``   a traceback, a crash (signal) or more than one line of error.

Only the first three pass. The matrix:

1. **SIGKILL** at random moments and while a checkpoint is being written (the ``.tmp`` file exists), for
   five paths: zero temperature, direct, pruned and fast spectral attention, and the particle overlay
   (killed while the PDE or the overlay runs); then a rerun to the end.
2. **Corruption** of the checkpoint and the results file of a partial run and of the results file of a
   complete run: byte-range classes (emptied, truncated, overwritten at the start, middle and end, a bit
   flipped at a random byte, garbage, appended bytes, duplicated halves, the file of another
   configuration, deleted, a stale .tmp) and value-level ones (a plausible bit flip in a density, a NaN,
   a negative time); then a rerun, and for a complete run also ``spherepde.load`` of the damaged file.
3. **A second run on a live directory** and **planted symbolic links** (six names).
4. **A full disk**: a tmpfs of a few hundred KiB (where this process may mount one) and a file-size limit
   (``RLIMIT_FSIZE``) at several sizes; then a rerun with room, which must resume and equal the reference.

Usage: ``python validation/fault_matrix.py [--quick]``; writes validation/fault_matrix.md (and .json).
``--quick`` runs a few trials of each kind (what tests/test_faults.py runs in the default test suite).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

_BASE = """
name = "{name}"
[grid]
type = "healpix"
nside = {nside}
[model]
{model}
[initial]
{initial}
[time]
t_end = {t_end}
save_every = {save_every}
[output]
checkpoint_every = 0.0   # after every step: many kill points
plots = []
{extra}
"""
_ZT_MODEL = 'type = "zero_temperature"\nB = "paper"\nV = "paper"'
_VMF = 'type = "vmf_mixture"\nmeans = [[1, 1, 0]]\nkappas = 3.0\nuniform_weight = 0.5'
CASES = {
    "zero_temperature": dict(nside=8, model=_ZT_MODEL, initial=_VMF, t_end=8.0, save_every=1.0, extra=""),
    "direct": dict(nside=8, model='type = "attention"\nB = "paper"\nV = "paper"\nbeta = 5.0\nmethod = "direct"',
                   initial=_VMF, t_end=8.0, save_every=1.0, extra=""),
    "pruned": dict(nside=16, model='type = "attention"\nB = "paper"\nV = "paper"\nbeta = 50.0\nmethod = "pruned"',
                   initial=_VMF, t_end=1.5, save_every=0.25, extra=""),
    "fast_spectral": dict(nside=32, model='type = "attention"\nB = "paper"\nV = "paper"\nbeta = 30.0\n'
                          'tol = 1e-10\nmethod = "spectral"',
                          # two caps: the fast path flags the targets of small D, the in-house series passes
                          # about a third of them, and that memory (checkpointed) decides where they go next
                          initial='type = "vmf_mixture"\nmeans = [[1, 1, 0], [-1, -1, 0]]\nkappas = 8.0\n'
                                  'uniform_weight = 0.0',
                          t_end=0.2, save_every=0.04, extra=""),
    "particles": dict(nside=8, model=_ZT_MODEL, initial=_VMF, t_end=8.0, save_every=1.0,
                      extra="[particles]\nn = 400\nseed = 3\ndt = 0.002\nmethod = \"rk4\""),
}


def config_text(case: str, **over) -> str:
    kw = dict(CASES[case], name=case)
    kw.update(over)
    return _BASE.format(**kw)


def cli(args, cwd=None, env=None, limit=None, timeout=900, wait=True):
    """Run ``python -m spherepde.cli ARGS``; ``limit`` = RLIMIT_FSIZE in bytes for the child."""
    pre = None
    if limit is not None:
        def pre():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    e = dict(os.environ, **(env or {}))
    e.setdefault("PYTHONPATH", str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "spherepde.cli", "-q", *args], cwd=cwd or ROOT, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
    if not wait:
        return p
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def fingerprint(path) -> str:
    """SHA-256 of a finished run's results (times, densities, diagnostics, step count, groups)."""
    from spherepde import io

    r = io.load(path)
    h = hashlib.sha256()
    for a in (r.times, r.density, np.array([r.n_steps])):
        h.update(np.ascontiguousarray(a).tobytes())
    for group in (r.diagnostics, r.metadata.get("concentration") or {}, r.metadata.get("particles") or {}):
        for k in sorted(group):
            h.update(k.encode())
            h.update(np.ascontiguousarray(np.asarray(group[k], dtype=float)).tobytes())
    return h.hexdigest()


def one_line_error(rc, err) -> bool:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    return rc > 0 and len(lines) == 1 and "Traceback" not in err


def classify_run(rc, err, out_dir, ref) -> str:
    """Outcome of a (re)run that should finish: identical, clear error, WRONG or TRACEBACK."""
    if rc == 0:
        try:
            return "identical" if fingerprint(Path(out_dir) / "results.h5") == ref else "WRONG"
        except Exception as exc:  # noqa: BLE001 - a completed run whose results cannot be read
            return f"WRONG ({type(exc).__name__})"
    if one_line_error(rc, err):
        return "clear error"
    return "TRACEBACK"


class Matrix:
    def __init__(self, work: Path, rng_seed=2026):
        self.work = Path(work)
        self.rng = random.Random(rng_seed)
        self.refs: dict[str, tuple[str, float]] = {}
        self.rows: list[dict] = []
        self.n = 0

    # -------------------------------------------------------------------- helpers
    def cfg(self, case, **over) -> Path:
        p = self.work / f"{case}{'_' + str(abs(hash(tuple(sorted(over.items()))))) if over else ''}.toml"
        p.write_text(config_text(case, **over))
        return p

    def fresh(self, tag) -> Path:
        self.n += 1
        d = self.work / f"t{self.n:03d}_{tag}"
        shutil.rmtree(d, ignore_errors=True)
        return d

    def reference(self, case) -> tuple[str, float]:
        if case not in self.refs:
            d = self.work / f"ref_{case}"
            shutil.rmtree(d, ignore_errors=True)
            rc, _, err = cli(["run", str(self.cfg(case)), "-o", str(d)])
            assert rc == 0, f"reference run of {case} failed: {err}"
            # the kill moments are drawn within the wall time of a second run: the first may have compiled
            # the kernels (after a source change), the trials load them from Numba's cache
            again = self.work / f"ref2_{case}"
            t0 = time.perf_counter()
            rc, _, err = cli(["run", str(self.cfg(case)), "-o", str(again)])
            wall = time.perf_counter() - t0
            assert rc == 0 and fingerprint(again / "results.h5") == fingerprint(d / "results.h5"), err
            self.refs[case] = (fingerprint(d / "results.h5"), wall)
        return self.refs[case]

    def record(self, kind, case, trial, outcome, detail=""):
        row = {"kind": kind, "case": case, "trial": trial, "outcome": outcome, "detail": detail}
        self.rows.append(row)
        print(f"{kind:12s} {case:16s} {trial:34s} {outcome:12s} {detail}", flush=True)
        return row

    # -------------------------------------------------------------------- 1. SIGKILL
    def kill_trial(self, case, mode):
        ref, wall = self.reference(case)
        d = self.fresh(f"kill_{case}")
        cfg = self.cfg(case)
        p = cli(["run", str(cfg), "-o", str(d)], wait=False)
        t0 = time.perf_counter()
        tmp = d / "checkpoint.h5.tmp"
        during = False
        if mode == "checkpoint_write":
            # wait a random part of the run, then kill the moment a checkpoint is being written
            start = t0 + self.rng.uniform(0.35, 0.8) * wall
            while p.poll() is None and time.perf_counter() < t0 + 2 * wall:
                if time.perf_counter() >= start and tmp.exists():
                    during = True
                    break
                time.sleep(0.0002)
        else:
            time.sleep(self.rng.uniform(0.3, 0.95) * wall)
        killed = p.poll() is None
        if killed:
            p.send_signal(signal.SIGKILL)
        p.communicate()
        at = time.perf_counter() - t0
        rc, _, err = cli(["run", str(cfg), "-o", str(d)])
        outcome = classify_run(rc, err, d, ref)
        note = (f"killed at {at:.2f} s of {wall:.1f} s" + (" during a checkpoint write" if during else "")
                if killed else "the run ended before the kill (not counted as a kill)")
        return self.record("SIGKILL", case, mode, outcome, note), killed

    # -------------------------------------------------------------------- 2. corruption
    def _prepared(self, case, complete: bool) -> Path:
        key = f"prep_{case}_{'complete' if complete else 'partial'}"
        d = self.work / key
        if not d.exists():
            if complete:
                shutil.copytree(self.work / f"ref_{case}", d)
            else:
                from spherepde.config import load_config
                from spherepde.runner import run_experiment

                run_experiment(load_config(self.cfg(case)), d, figures=False, stop_after_steps=120)
        return d

    CLASSES = ("emptied", "truncated_half", "truncated_last_1k", "zero_superblock", "random_1k_start",
               "random_1k_middle", "random_1k_end", "zero_4k_middle", "bit_flip_random_byte", "garbage_text",
               "appended_4k", "duplicated_half", "other_config", "deleted", "stale_tmp", "plausible_value_flip",
               "nan_value", "negative_time")

    def corrupt(self, path: Path, cls: str, seed: int, other: Path):
        import h5py

        rng = np.random.default_rng(seed)
        raw = bytearray(path.read_bytes())
        n = len(raw)
        if cls == "emptied":
            raw = bytearray()
        elif cls == "truncated_half":
            raw = raw[: n // 2]
        elif cls == "truncated_last_1k":
            raw = raw[: max(0, n - 1024)]
        elif cls == "zero_superblock":
            raw[:512] = bytes(512)
        elif cls.startswith("random_1k"):
            at = {"start": 512, "middle": n // 2, "end": max(0, n - 1024)}[cls.split("_")[-1]]
            raw[at:at + 1024] = rng.integers(0, 256, 1024, dtype=np.uint8).tobytes()
        elif cls == "zero_4k_middle":
            raw[n // 2 - 2048:n // 2 + 2048] = bytes(4096)
        elif cls == "bit_flip_random_byte":
            i = int(rng.integers(0, n))
            raw[i] ^= 1 << int(rng.integers(0, 8))
        elif cls == "garbage_text":
            raw = bytearray(b"not an HDF5 file\n" * 100)
        elif cls == "appended_4k":
            raw += rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
        elif cls == "duplicated_half":
            raw[n // 2:] = raw[: n - n // 2]
        elif cls == "other_config":
            raw = bytearray(other.read_bytes())
        elif cls == "deleted":
            path.unlink()
            return
        elif cls == "stale_tmp":
            path.with_name(path.name + ".tmp").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
            return
        else:  # value-level, through HDF5: plausible (finite, >= 0) or not
            with h5py.File(path, "a") as h:
                name = "f" if "f" in h else "density"
                ds = h[name]
                idx = (7,) if ds.ndim == 1 else (ds.shape[0] - 1, 7)
                if cls == "plausible_value_flip":
                    v = np.float64(ds[idx])
                    ds[idx] = (v.view(np.uint64) ^ np.uint64(4)).view(np.float64)
                elif cls == "nan_value":
                    ds[idx] = np.nan
                elif "t" in h.attrs:
                    h.attrs["t"] = -1.0
                else:
                    t = h["time"][()]
                    t[-1] = -1.0
                    h["time"][...] = t
            return
        path.write_bytes(bytes(raw))

    def corruption_trial(self, case, target, cls, seed=0):
        """target: checkpoint (partial run), results_partial, results_complete."""
        from spherepde import io

        ref, _ = self.reference(case)
        other_case = self.work / "ref_other"
        if not other_case.exists():
            rc, _, err = cli(["run", str(self.cfg(case, initial=_VMF.replace("kappas = 3.0", "kappas = 5.0"))),
                              "-o", str(other_case)])
            assert rc == 0, err
        complete = target == "results_complete"
        src = self._prepared(case, complete)
        d = self.fresh(f"corrupt_{target}")
        shutil.copytree(src, d)
        name = "checkpoint.h5" if target == "checkpoint" else "results.h5"
        self.corrupt(d / name, cls, seed, other_case / name)
        detail = ""
        if complete:  # what a reader gets from the damaged file
            try:
                back = io.load(d / "results.h5")
                got = fingerprint(d / "results.h5")
                if got == ref:
                    detail = "load: the data intact"
                elif back.metadata["config"] is not None and back.metadata["config"].text != self.cfg(case).read_text():
                    detail = "load: another run's intact file (its stored configuration says so)"
                else:
                    return self.record("corruption", case, f"{target}:{cls}", "WRONG", "load: DIFFERENT DATA")
            except (ValueError, OSError) as exc:
                detail = f"load: {type(exc).__name__}"
        rc, _, err = cli(["run", str(self.cfg(case)), "-o", str(d)])
        outcome = classify_run(rc, err, d, ref)
        if outcome == "clear error":
            detail += ("; " if detail else "") + err.strip()[:120]
        return self.record("corruption", case, f"{target}:{cls}", outcome, detail)

    # -------------------------------------------------------------------- 3. live directory, links
    def live_trial(self, case="zero_temperature"):
        ref, wall = self.reference(case)
        d = self.fresh("live")
        cfg = self.cfg(case)
        p = cli(["run", str(cfg), "-o", str(d)], wait=False)
        deadline = time.time() + 120
        while not (d / "checkpoint.h5").exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.01)
        rc2, _, err2 = cli(["run", str(cfg), "-o", str(d), "--restart"])
        live = p.poll() is None  # the first run still held the directory when the second one finished
        _, err1 = p.communicate()
        first = classify_run(p.returncode, err1, d, ref)
        if not live and rc2 == 0:
            return self.record("live dir", case, "second run, --restart", "void",
                               "the first run ended before the second started: not a live directory")
        ok = rc2 == 2 and one_line_error(rc2, err2) and first == "identical"
        return self.record("live dir", case, "second run, --restart", "refused" if ok else "WRONG",
                           f"second: exit {rc2}; first: {first}")

    LINKS = ("experiment.toml", "results.h5", "results.h5.tmp", "checkpoint.h5", "checkpoint.h5.tmp", "figures")

    def link_trial(self, name, case="zero_temperature"):
        d = self.fresh("link")
        d.mkdir(parents=True)
        victim = self.work / f"victim_{self.n}"
        victim.write_text("precious\n")
        (d / name).symlink_to(victim)
        rc, _, err = cli(["run", str(self.cfg(case)), "-o", str(d)])
        intact = victim.read_text() == "precious\n"
        ok = rc == 2 and one_line_error(rc, err) and intact
        return self.record("symlink", case, name, "refused" if ok else "WRONG",
                           f"exit {rc}; victim {'untouched' if intact else 'OVERWRITTEN'}")

    # -------------------------------------------------------------------- 4. full disk
    def disk_trial(self, case, how, size):
        ref, _ = self.reference(case)
        cfg = self.cfg(case)
        mnt = None
        if how == "tmpfs":
            mnt = self.work / f"tmpfs_{self.n + 1}"
            mnt.mkdir()
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                               text=True)
            if r.returncode != 0:
                return self.record("disk full", case, f"tmpfs {size}", "skipped", "cannot mount a tmpfs here")
            d = mnt / "run"
            self.n += 1
            rc, _, err = cli(["run", str(cfg), "-o", str(d)])
        else:
            d = self.fresh("fsize")
            rc, _, err = cli(["run", str(cfg), "-o", str(d)], limit=size)
        first = "completed" if rc == 0 else ("clear error" if one_line_error(rc, err) else "TRACEBACK")
        if mnt is not None:  # room again: move the directory to a real disk and rerun there
            dest = self.work / f"from_tmpfs_{self.n}"
            shutil.copytree(d, dest, symlinks=True)
            subprocess.run(["umount", str(mnt)], capture_output=True)
            d = dest
        rc2, _, err2 = cli(["run", str(cfg), "-o", str(d)])
        second = classify_run(rc2, err2, d, ref)
        ok = first != "TRACEBACK" and second == "identical"
        outcome = ("identical" if first == "completed" else "clear error") if ok else "WRONG"
        return self.record("disk full", case, f"{how} {size}", outcome,
                           f"first: {first} ({err.strip()[:90]}); rerun with room: {second}")


def run(quick: bool, work: Path) -> list[dict]:
    m = Matrix(work)
    cases = list(CASES)
    if quick:
        m.kill_trial("zero_temperature", "random")
        m.kill_trial("zero_temperature", "checkpoint_write")
        m.kill_trial("fast_spectral", "random")
        for target, cls in (("checkpoint", "random_1k_middle"), ("checkpoint", "plausible_value_flip"),
                            ("results_partial", "truncated_half"), ("results_complete", "plausible_value_flip")):
            m.corruption_trial("zero_temperature", target, cls)
        m.live_trial()
        m.link_trial("checkpoint.h5.tmp")
        m.disk_trial("zero_temperature", "fsize", 200000)
        return m.rows
    kills = 0
    for case in cases:  # 3 random + 2 during checkpoint writes each, 2 more random for zero temperature
        for mode in ["random", "checkpoint_write", "random", "checkpoint_write", "random"] + (
                ["random", "random"] if case == "zero_temperature" else []):
            kills += m.kill_trial(case, mode)[1]
    for target in ("checkpoint", "results_partial", "results_complete"):
        for cls in Matrix.CLASSES:
            if target == "results_complete" and cls == "stale_tmp":
                continue
            m.corruption_trial("zero_temperature", target, cls, seed=len(m.rows))
    for seed in (11, 12, 13):  # more random single-bit flips
        m.corruption_trial("zero_temperature", "checkpoint", "bit_flip_random_byte", seed)
        m.corruption_trial("zero_temperature", "results_complete", "bit_flip_random_byte", seed)
    m.live_trial()
    m.live_trial("particles")
    for name in Matrix.LINKS:
        m.link_trial(name)
    for size in ("200k", "300k", "400k"):
        m.disk_trial("zero_temperature", "tmpfs", size)
    for size in (20000, 120000, 180000, 250000, 320000):
        m.disk_trial("zero_temperature", "fsize", size)
    m.disk_trial("particles", "fsize", 250000)
    print(f"{kills} SIGKILLs landed")
    m.rows.append({"kind": "summary", "case": "", "trial": "SIGKILLs that landed", "outcome": "identical",
                   "detail": f"{kills} of {sum(r['kind'] == 'SIGKILL' for r in m.rows)} kill trials killed a live run"})
    return m.rows


def report(rows, wall, quick) -> str:
    from collections import Counter

    good = {"identical", "clear error", "refused", "skipped", "void"}
    summary = [r for r in rows if r["kind"] == "summary"]
    rows = [r for r in rows if r["kind"] != "summary"]
    by = {}
    for r in rows:
        by.setdefault(r["kind"], Counter())[r["outcome"].split(" (")[0]] += 1
    lines = ["# Fault-injection matrix (issue #21)", "",
             f"`python validation/fault_matrix.py{' --quick' if quick else ''}`: {len(rows)} trials in {wall:.0f} s "
             f"on {os.cpu_count()} cores; {sum(r['outcome'] not in good for r in rows)} failed "
             "(outcomes: identical = the rerun equals the uninterrupted run bit for bit; clear error = non-zero exit, "
             "one line; refused = exit 2, one line, nothing outside the directory written)."
             + "".join(f" {r['detail']}." for r in summary), "",
             "| kind | trials | outcomes |", "|---|---|---|"]
    for k, c in by.items():
        lines.append(f"| {k} | {sum(c.values())} | " + ", ".join(f"{o}: {n}" for o, n in sorted(c.items())) + " |")
    lines += ["", "## Every trial", "", "| kind | case | trial | outcome | detail |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['case']} | {r['trial']} | {r['outcome']} | {r['detail'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="spherepde_faults_"))
    t0 = time.perf_counter()
    try:
        rows = run(a.quick, work)
    finally:
        if not a.keep:
            for mnt in work.glob("tmpfs_*"):
                subprocess.run(["umount", str(mnt)], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - t0
    suffix = "_quick" if a.quick else ""
    (HERE / f"fault_matrix{suffix}.md").write_text(report(rows, wall, a.quick))
    (HERE / f"fault_matrix{suffix}.json").write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=1))
    bad = [r for r in rows if r["outcome"] not in {"identical", "clear error", "refused", "skipped", "void"}]
    print(f"{len(rows)} trials, {len(bad)} failed, {wall:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
