# fairsched: `make test` and `make run` set everything up from nothing, saying each step in
# one line; pip and the compiler speak only when something goes wrong.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYX := $(wildcard fairsched/core/*.pyx fairsched/core/*.pxd fairsched/worker/*.pyx)
CONFIG ?= examples/workers.toml
# setuptools warns at every editable install that a folder named like the package could be
# imported instead of it: that folder is this checkout, which is the point.
PIP := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip -q
# [build-system] requires, for the editable install below to build without an isolated env.
BUILD_TOOLS := pip "setuptools>=77" wheel "Cython>=3.0,<3.4"

.PHONY: all venv build browser test run bench bench-all lint clean

all: build

# A stamp rather than .venv itself: a first run cut short (no network) starts over.
$(VENV)/.created:
	@$(PYTHON) scripts/check_prereqs.py
	@echo "==> creating $(VENV) with $(PYTHON) ($$($(PYTHON) -c 'import platform; print(platform.python_version())')) and the build tools"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install --upgrade $(BUILD_TOOLS)
	@touch $@

# The core is compiled in the next step, on its own line. What `make run` needs only: the
# tools the tests use (the test, lint and plot extras) come with `make test`.
$(VENV)/.installed: $(VENV)/.created pyproject.toml setup.py
	@echo "==> installing fairsched and its dependencies into $(VENV) (pip; a minute or two the first time)"
	@FAIRSCHED_NO_EXTENSIONS=1 $(PIP) install --no-build-isolation -e '.[examples]'
	@touch $@

$(VENV)/.test-tools: $(VENV)/.installed
	@echo "==> installing what the tests need into $(VENV) (the test, lint and plot extras: pytest, playwright, ruff, matplotlib)"
	@FAIRSCHED_NO_EXTENSIONS=1 $(PIP) install --no-build-isolation -e '.[test,lint,plot,examples]'
	@touch $@

$(VENV)/.built: $(VENV)/.installed $(PYX)
	@echo "==> compiling the scheduling core (Cython, then the C compiler)"
	@$(PY) setup.py -q build_ext --inplace
	@touch $@

venv: $(VENV)/.installed

# Bytecode too: where PYTHONDONTWRITEBYTECODE is set, every command would otherwise
# compile the package again at each start (about 0.15 s).
build: $(VENV)/.built
	@$(PY) -m compileall -q fairsched

# Most tests wait on real supervisors, workers and PostgreSQL rather than compute, so more
# pytest-xdist workers than cores pay off (on 2 cores, 6 workers: 6 min 24 s; 4: 7 min 13 s);
# each worker runs its own embedded PostgreSQL.
# Tests are handed out two at a time, the longest first (tests/conftest.py), so the slow ones
# spread over the workers. PYTEST_ARGS come after: `make test PYTEST_ARGS='-n0
# tests/test_cli_ps.py'` runs serially.
TEST_WORKERS ?= 6

# The dashboard's tests drive a real headless Chromium: Debian's package, installed when
# missing (as root, as CI runs); playwright drives it, and downloads no browser of its own.
browser:
	@command -v chromium >/dev/null || { echo "==> installing chromium for the dashboard's browser tests (apt-get)"; \
		out=$$( (apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y \
			--no-install-recommends chromium) 2>&1) || { echo "$$out"; exit 1; }; }

test: build $(VENV)/.test-tools browser
	@echo "==> running the tests"
	@FAIRSCHED_REQUIRE_EXTENSIONS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 2 $(PYTEST_ARGS)

run: build
	@echo "==> starting the supervisor on $(CONFIG) (Ctrl-C or fairsched stop ends it)"
	@$(BIN)/fairsched supervise --config $(CONFIG)

bench: build
	$(PY) scripts/bench_core.py

bench-all: build
	@FAIRSCHED_NO_EXTENSIONS=1 $(PIP) install --no-build-isolation -e '.[bench]'
	$(PY) scripts/bench_core.py
	$(PY) scripts/bench_cycle.py
	$(PY) scripts/bench_ondemand.py
	$(PY) scripts/bench_spawn.py
	$(PY) scripts/bench_worker.py
	$(PY) scripts/bench_store.py
	$(PY) scripts/bench_throughput.py
	$(PY) scripts/bench_recycle.py
	$(PY) scripts/bench_transaction.py
	$(PY) scripts/bench_dashboard.py
	$(PY) scripts/bench_tenants.py
	$(PY) scripts/bench_sched.py

lint: build $(VENV)/.test-tools
	$(BIN)/ruff check fairsched tests scripts examples
	PATH=$(BIN):$$PATH $(BIN)/cython-lint fairsched/core

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find fairsched -name '*.so' -delete -o -name '*.c' -delete -o -name '*.html' -delete -o -name __pycache__ -prune -exec rm -rf {} +
