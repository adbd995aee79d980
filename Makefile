# Two commands from a fresh clone: `make app` (dashboard on the default preset) and `make test`.
# `make shipped` regenerates every file in analyzer/shipped/ (full-size conversions: ~15 GB and 3-10 min each).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Prefix for the full-size conversions, e.g. FULLSIZE_LOCK="flock /tmp/qfold-fullsize.lock" on a shared machine.
FULLSIZE_LOCK ?=

.PHONY: app test lint shipped

# scripts/install-requirements installs with uv from pip's own sources (~10 s instead of pip's ~45 s), else pip.
# Neither compiles every installed module to bytecode (~85 s of a ~150 s install here: torch, transformers,
# ray, sympy, ... hold ~19,000 modules). Two processes import what a run imports (the conversion child's modules;
# Streamlit, Ray, pandas, ...) and so write those .pyc files, ~35 s of CPU on the two cores at once instead of the
# test run's first processes compiling the same modules side by side; any other module is compiled the first time
# a run imports it. So make's commands clear PYTHONDONTWRITEBYTECODE (an empty value is unset to Python): with it
# set, every process would compile its imports again.
export PYTHONDONTWRITEBYTECODE :=

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) scripts/install-requirements -r requirements.txt -r requirements-dev.txt -e .
	@echo "compiling the modules a run imports (two processes at once)"
	@$(PY) -c "import analyzer.convert.child, transformers.models.llama.modeling_llama" >/dev/null 2>&1 & conv=$$!; \
	$(PY) -c "import streamlit.web.bootstrap, ray, pandas, plotly, pandera, pyarrow, hypothesis, playwright.sync_api, xdist" \
		>/dev/null 2>&1; wait $$conv; true  # an optimisation only: a module it missed compiles on first import
	touch $(STAMP)

app: $(STAMP)
	$(VENV)/bin/streamlit run app.py

# Tests: one worker per core, a test file's tests on one worker (its module fixtures made once), the files with
# conversion or browser tests first (tests/conftest.py).
# Debian's packages install while pip installs the venv (apt and pip share nothing): on a fresh machine the two
# waits overlap instead of adding up.
test:
	@bash scripts/ensure-system-packages & system=$$!; \
	$(MAKE) --no-print-directory $(STAMP); venv=$$?; \
	wait $$system; apt=$$?; [ $$venv -eq 0 ] && [ $$apt -eq 0 ]
	$(PY) -m ruff check .
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(PY) -m ruff check .

shipped: $(STAMP)
	$(FULLSIZE_LOCK) env PYTHONPATH=. $(PY) bench/full_size.py --every-shipped
