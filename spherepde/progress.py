"""Progress of a run in simulated time, on tqdm (a terminal bar, or its widget in Jupyter).

``ProgressBar(t_end)`` keeps the interface the solver and runner use (``update(t, dt)``, ``close()``)
on top of ``tqdm.auto``: in a terminal it draws a bar with the elapsed time, ETA and the step size;
in a Jupyter notebook, tqdm's widget (the hand-written bar it replaces wrote ``\\r`` to stderr, which
notebooks do not show). Outside both (a log file, a pipe) it stays silent unless ``force`` is given.
"""
from __future__ import annotations

import sys

__all__ = ["ProgressBar", "in_notebook"]


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where tqdm.auto draws its widget when ipywidgets is
    installed, else a text bar that the notebook shows too)."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except AttributeError:  # pragma: no cover - an IPython without get_ipython
        ip = None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _tqdm_class():
    """tqdm.auto's class, except in a notebook without ipywidgets, where tqdm.auto warns and falls back
    to the text bar anyway: that bar directly (the notebook shows it)."""
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            from tqdm.std import tqdm

            return tqdm
    from tqdm.auto import tqdm

    return tqdm


class ProgressBar:
    """Progress in simulated time from 0 to ``total``: ``update(t, dt)``, then ``close()``."""

    def __init__(self, total: float, stream=None, force: bool = False, min_interval: float = 0.2,
                 desc: str | None = None):
        self.total = float(total)
        tqdm = _tqdm_class()
        stream = sys.stderr if stream is None else stream
        # tqdm's disable=None: shown on a terminal only; a notebook's stream is no terminal, so its
        # widget is asked for explicitly
        disable = False if (force or in_notebook()) else None
        self._bar = tqdm(total=self.total, file=stream, disable=disable, mininterval=min_interval, unit="t",
                         desc=desc, leave=True, dynamic_ncols=True,
                         bar_format="{l_bar}{bar}| t={n:.4g}/{total:.4g} [{elapsed}<{remaining}{postfix}]")
        self.enabled = not self._bar.disable

    def update(self, t: float, dt: float | None = None):
        if not self.enabled:
            return
        t = min(max(float(t), 0.0), self.total)
        if dt is not None:
            self._bar.set_postfix_str(f"dt={dt:.2e}", refresh=False)
        self._bar.update(t - self._bar.n)

    def close(self):
        if self.enabled:
            self.update(self.total)
        self._bar.close()
