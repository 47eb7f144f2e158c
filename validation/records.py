"""Record files that several runs of a study update at once: an exclusive lock for the read-merge-write and an
atomic write, so that parallel calls (one member each) neither lose each other's rows nor leave half a file.

``fig4_concentration/adaptive.py`` (and ``log_tails.py`` and ``lagrangian.py`` through it) and
``adaptive_clusters/run.py`` and ``token_ensembles/law.py`` keep their JSON records with these.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path


@contextlib.contextmanager
def locked(path):
    """An exclusive lock on ``path`` + ".lock" (``adaptive.json.lock``) for a read-merge-write of the record
    file ``path`` by one of several runs of a script at once (POSIX ``flock``; released when the block ends,
    or when the process dies)."""
    import fcntl

    path = Path(path)
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def upsert(path, row: dict, key) -> None:
    """Replace the row of ``path`` (a JSON list of records) with the same ``key`` as ``row`` by ``row`` (or add
    it), sorted by ``key``; read, merge and write under :func:`locked`, the write atomic."""
    path = Path(path)
    with locked(path):
        rows = json.loads(path.read_text()) if path.exists() else []
        rows = [x for x in rows if key(x) != key(row)] + [row]
        write_atomic(path, json.dumps(sorted(rows, key=key), indent=1))
