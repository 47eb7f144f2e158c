# Two commands do all set-up on a fresh machine with only Python:
#   make test   -- creates .venv if missing, installs, runs the tests
#   make run    -- same set-up, then runs the default experiment and writes its figures
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run validate docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

# parallel test processes (pytest-xdist): one per core, at most 4 (each loads numba, dask, healpy)
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4

run: $(STAMP)
	$(PY) -m spherepde.experiments.default --output output/default

# the scan studies run on a LocalCluster; DASK_SCHEDULER_ADDRESS=tcp://host:8786 make validate uses a cluster
validate: $(STAMP)
	$(PY) -m validation.run_all

# the HTML documentation (Sphinx: the guides, the API reference from the docstrings, the validation
# studies) in docs/_build/html; warnings are errors
docs: $(STAMP)
	$(PY) -m sphinx -W -q -b html docs docs/_build/html
	@echo docs/_build/html/index.html

clean:
	rm -rf output .pytest_cache
