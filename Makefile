# Two commands from a fresh clone: `make app` (dashboard on the default preset) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: app test lint

$(STAMP): requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

app: $(STAMP)
	$(VENV)/bin/streamlit run app.py

test: $(STAMP)
	bash scripts/ensure-chromium
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
