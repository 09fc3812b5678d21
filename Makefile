# Two entry points: `make demo` and `make test`. Both create .venv on first use: the demo
# installs only torch and ferry itself (about a minute), the tests every extra.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# This machine keeps the CPU build of torch under /opt/wheels; never let pip fetch a newer one.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP    := $(BIN)/python -m pip install -q $(FIND_LINKS)

.PHONY: demo test test-long check lint typecheck system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -c constraints.txt -e '.[test,process,lightning,transformers,keras]'
	touch $@ $(DEMO_STAMP)

# What the demo needs: torch and ferry's own dependencies, no extra (the full set is 1.8 GB).
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -c constraints.txt -e .
	touch $@

# Debian packages the integration tests use (SLURM, munge, XRootD). Only as root;
# elsewhere those tests skip and say why.
system-deps:
	@bash scripts/install-system-deps.sh

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite but its long tier (CI's verdict: within 8 minutes on 2 cores), on three
# pytest-xdist workers, with ruff, the import contracts and
# mypy --strict running beside it (scripts/test.sh); ends with the 20 slowest tests.
test: $(STAMP) system-deps
	@bash scripts/test.sh full

# The long tier (tests/conftest.py): soaks, fuzzers, every framework lineage, many nodes.
test-long: $(STAMP) system-deps
	@bash scripts/test.sh long

# The edit loop: unit tests and the core integration tests (those not marked slow).
check: $(STAMP)
	@bash scripts/test.sh check

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache .mypy_cache .ruff_cache
