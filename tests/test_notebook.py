"""Notebooks (issue #20 item 5): the shipped notebook executes in a real Jupyter kernel (nbclient), and
progress is tqdm's, shown in a terminal and in a notebook, silent in a pipe."""
import io
import os
from pathlib import Path

import pytest

from spherepde.progress import ProgressBar

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebooks" / "figures_3_4.ipynb"


def test_progress_bar_is_tqdm_and_silent_in_a_pipe():
    shown = io.StringIO()
    bar = ProgressBar(2.0, stream=shown, force=True, min_interval=0)
    for t in (0.5, 1.0, 1.5):
        bar.update(t, 0.01)
    bar.close()
    text = shown.getvalue()
    assert "100%|" in text and "t=2/2" in text and "dt=1.00e-02" in text  # tqdm's bar, in simulated time
    quiet = io.StringIO()  # not a terminal, not a notebook: nothing written
    bar = ProgressBar(2.0, stream=quiet)
    bar.update(1.0)
    bar.close()
    assert quiet.getvalue() == "" and not bar.enabled


def test_the_notebook_executes_and_shows_its_figures_and_progress(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["SPHEREPDE_NOTEBOOK_NSIDE"] = "4"  # 192 cells: the same code as nside 8, in ~10 s
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        del os.environ["SPHEREPDE_NOTEBOOK_NSIDE"]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 3  # maps, alignment curves, W2 / align E against t: the backend was left inline
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "100%|" in stderr and "t=20/20" in stderr  # solve(progress=True) is visible in the notebook
    assert "IProgress not found" not in stderr
