# fairsched: `make test` and `make run` set everything up from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYX := $(wildcard fairsched/core/*.pyx fairsched/core/*.pxd)
CONFIG ?= examples/workers.toml

.PHONY: all venv build test run bench bench-all lint clean

all: build

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=77" wheel "Cython>=3.0,<3.4"

$(VENV)/.installed: $(BIN)/activate pyproject.toml setup.py
	$(PY) -m pip install -q -e '.[test,lint,plot,examples]'
	touch $@

$(VENV)/.built: $(VENV)/.installed $(PYX)
	$(PY) setup.py -q build_ext --inplace
	touch $@

venv: $(VENV)/.installed

# Bytecode too: where PYTHONDONTWRITEBYTECODE is set, every command would otherwise
# compile the package again at each start (about 0.15 s).
build: $(VENV)/.built
	@$(PY) -m compileall -q fairsched

test: build
	FAIRSCHED_REQUIRE_EXTENSIONS=1 $(PY) -m pytest $(PYTEST_ARGS)

run: build
	$(BIN)/fairsched supervise --config $(CONFIG)

bench: build
	$(PY) scripts/bench_core.py

bench-all: build
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench_core.py
	$(PY) scripts/bench_ondemand.py
	$(PY) scripts/bench_spawn.py
	$(PY) scripts/bench_worker.py
	$(PY) scripts/bench_throughput.py
	$(PY) scripts/bench_sched.py

lint: build
	$(BIN)/ruff check fairsched tests scripts examples
	PATH=$(BIN):$$PATH $(BIN)/cython-lint fairsched/core

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find fairsched -name '*.so' -delete -o -name '*.c' -delete -o -name '*.html' -delete -o -name __pycache__ -prune -exec rm -rf {} +
