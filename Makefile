# The two commands of the quickstart. Each builds its own virtual environment on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	@bash scripts/ensure-bubblewrap.sh
	$(VENV)/bin/forklab demo --yes

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	@bash scripts/ensure-chromium.sh
	@bash scripts/ensure-bubblewrap.sh
	@bash scripts/ensure-postgres.sh
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(VENV)/bin/python bench/engine.py
