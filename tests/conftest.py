"""Shared fixtures."""
import pytest


@pytest.fixture
def one_numba_thread():
    """Small grids: Numba's thread pool only adds synchronisation (20x slower on a loaded 2-core
    machine); the results do not depend on the thread count (validation/determinism.py)."""
    import numba

    n = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(n)


@pytest.fixture
def steps_taken(monkeypatch):
    """A list that grows by one at every ``Solver.step`` taken from now on (a run continued from a checkpoint
    takes only the steps after it)."""
    from spherepde.solver import Solver

    taken, step = [], Solver.step

    def counted(self, *a, **k):
        taken.append(1)
        return step(self, *a, **k)

    monkeypatch.setattr(Solver, "step", counted)
    return taken
