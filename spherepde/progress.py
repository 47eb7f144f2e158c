"""A dependency-free progress bar with ETA (stderr, only when it is a terminal)."""
from __future__ import annotations

import sys
import time

__all__ = ["ProgressBar"]


def _fmt(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    """Progress in simulated time: ``update(t)``; silent unless ``stream`` is a terminal (or forced)."""

    def __init__(self, total: float, stream=None, width: int = 30, force: bool = False, min_interval: float = 0.2):
        self.total = float(total)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = force or (hasattr(self.stream, "isatty") and self.stream.isatty())
        self.width = width
        self.start = time.perf_counter()
        self.min_interval = min_interval
        self._last = 0.0

    def update(self, t: float, dt: float | None = None):
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < self.min_interval and t < self.total:
            return
        self._last = now
        frac = 1.0 if self.total <= 0 else min(1.0, max(0.0, t / self.total))
        elapsed = now - self.start
        eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        n = int(self.width * frac)
        bar = "#" * n + "-" * (self.width - n)
        eta_s = _fmt(eta) if eta == eta else "--:--"
        step = f" dt={dt:.2e}" if dt is not None else ""
        self.stream.write(f"\r[{bar}] {100 * frac:5.1f}% t={t:.4g}/{self.total:.4g}{step} {_fmt(elapsed)} "
                          f"ETA {eta_s}")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()
