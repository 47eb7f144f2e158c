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
