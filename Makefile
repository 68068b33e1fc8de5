# Every target creates .venv with what it needs when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test unit integration lint demo bench protos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -p no:unraisableexception tests/unit tests/integration tests/e2e

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -q tests/integration

demo: $(STAMP)
	$(BIN)/python examples/local/demo.py

bench: $(STAMP)
	$(BIN)/python tests/benchmarks/push_fanout.py
	$(BIN)/python tests/benchmarks/relay.py
	$(BIN)/python tests/benchmarks/ca.py

protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) pilotfish-state pilotfish-run
