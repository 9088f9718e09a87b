# The two commands of the quickstart. Each builds the virtual environment it needs on first
# use, saying what it installs, one line per phase (scripts/install.sh): `make demo` the
# runtime (ForkLab and what the demos need), `make test` also every extra and the tools.
PY ?= python3
VENV := .venv
#: every extra and the test tools installed (`make test`)
STAMP := $(VENV)/.installed
# Write bytecode even where the environment says not to: without it every test process and
# every `forklab` process a test starts compiles ForkLab and the tests from source again
# (about 5 s of CPU per pytest process here).
unexport PYTHONDONTWRITEBYTECODE
#: the runtime installed (`make demo`); a dev install has it too
RUNTIME := $(VENV)/.runtime

.PHONY: demo test test-fast golden lint bench

$(STAMP): pyproject.toml
	@PY=$(PY) VENV=$(VENV) bash scripts/install.sh dev
	@touch $(STAMP) $(RUNTIME)

$(RUNTIME): pyproject.toml
	@if [ $(STAMP) -nt pyproject.toml ]; then :; else PY=$(PY) VENV=$(VENV) bash scripts/install.sh runtime; fi
	@touch $(RUNTIME)

demo: $(RUNTIME)
	@bash scripts/ensure-bubblewrap.sh
	@$(VENV)/bin/forklab demo --yes

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Four xdist workers on two cores: the durable tests spend most of their time waiting on
# dev servers, workers, timers and sandboxes (one -n 2 run used 44 % of the CPU it had),
# so twice as many workers as cores finish sooner (docs/testing.md).
test: lint
	@bash scripts/ensure-chromium.sh
	@bash scripts/ensure-bubblewrap.sh
	@bash scripts/ensure-postgres.sh
	$(VENV)/bin/pytest -q -n 4

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
