# Every target creates .venv with what it needs when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv sysdeps test unit integration fuzz lint demo bench protos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# dig, dnsmasq and dnsperf (Debian) for the DNS tests and benchmark, when missing.
sysdeps:
	.ci/sysdeps

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) sysdeps lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -p no:unraisableexception tests/unit tests/integration tests/e2e

# The fuzz and property tests with FUZZ_SCALE times the examples `make test` runs (default
# 20: several minutes); e.g. `make fuzz FUZZ_SCALE=100`. Failures are kept in .hypothesis/
# and replayed first on the next run.
FUZZ_SCALE ?= 20
FUZZ_TESTS := tests/unit/test_fuzz_config.py tests/unit/test_xds_sotw.py tests/unit/test_xds_delta.py \
	tests/integration/test_fuzz_ads.py tests/integration/test_fuzz_live.py \
	tests/integration/test_fuzz_config_live.py tests/integration/test_dns_fuzz.py

fuzz: $(STAMP) sysdeps
	PILOTFISH_FUZZ_SCALE=$(FUZZ_SCALE) $(BIN)/python -m pytest -q -p no:cacheprovider \
		-p no:unraisableexception -o timeout=0 --hypothesis-show-statistics $(FUZZ_TESTS)

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q tests/integration

demo: $(STAMP)
	$(BIN)/python examples/local/demo.py

bench: $(STAMP) sysdeps
	$(BIN)/python tests/benchmarks/push_fanout.py
	$(BIN)/python tests/benchmarks/relay.py
	$(BIN)/python tests/benchmarks/dns.py $(DNS_BENCH_ARGS)
	$(BIN)/python tests/benchmarks/ca.py
	$(BIN)/python tests/benchmarks/translate.py

protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) pilotfish-state pilotfish-run
