# The two commands of the quickstart. Each builds its own virtual environment on first use.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Write bytecode even where the environment says not to: without it every test process and
# every `forklab` process a test starts compiles ForkLab and the tests from source again
# (about 5 s of CPU per pytest process here).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast golden lint bench

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
	$(VENV)/bin/pytest -q -n 2

# The pure tests (no server, worker, sandbox, process, database or mount; see
# docs/testing.md) and the golden histories' offline replay, in well under a minute; ruff
# only (mypy over the whole package takes longer than these tests).
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	FORKLAB_FUZZ_EXAMPLES=200 $(VENV)/bin/pytest -q -n 2 -m "not durable"

# Record tests/golden/ anew (after a deliberate change to a workflow: see docs/testing.md).
golden: $(STAMP)
	$(VENV)/bin/python scripts/record_golden_histories.py

bench: $(STAMP)
	$(VENV)/bin/python bench/engine.py
