# Every target sets itself up: a fresh clone needs only python3 (3.11+), make and kubectl.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
# checkov pins boto3/botocore older than the worker's, so it gets a virtualenv of its own.
TOOLS  ?= .venv-tools
TOOLS_STAMP = $(TOOLS)/.installed
PYTEST_ARGS ?=
# Parallel test processes for `make test` (pytest-xdist); most tests wait on servers, not the CPU.
# On 2 cores a clean clone's tests took 623 s with 4 and 659 s with 3 (same commit, same hour).
# With the rollout waves' acceptance test (6 minutes, mostly waiting on its soaks, on a worker of its
# own from the start) 4 workers left the CPUs idle 28 % of a 15-minute run: a fifth takes that up.
TEST_WORKERS ?= 5
# A CI image may set PYTHONDONTWRITEBYTECODE: then every Python process a test starts (the CLI, the
# worker, the simulator) compiles the checkout's modules again, and every xdist worker rewrites the
# test modules' asserts again. Let the first process cache them.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install chromium test test-deps unit integration lint format demo up down status bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	@# The wheel ships the product only; the development install also puts the checkout on the path,
	@# so sim/ (the local stack behind `karpflow dev|demo|sim`) and bench/ import from here.
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "karpflow-checkout.pth").write_text("$(CURDIR)\n")'
	touch $@

$(TOOLS_STAMP):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet 'checkov>=3.2,<4'
	touch $@

# What the tests need, side by side: the two pip installs are CPU-bound, and on two cores they take
# ~85 s together instead of ~135 s one after the other (a clean clone, measured).
test-deps:
	@$(MAKE) --no-print-directory -j2 install $(TOOLS_STAMP) chromium

# The Web UI test's browser (tests/integration/observe/test_web_ui.py): Debian's package, as root
# (CI, containers); elsewhere a hint, and the test skips (in CI, where CI=true, it fails instead).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the Web UI test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "chromium is missing: sudo apt-get install chromium (the Web UI test skips without it)"; \
	fi

## test: lint (ruff, mypy --strict on the product) and every test (unit and integration against real servers)
# mypy (~40 s of a core on a clean clone: no cache) runs beside the tests, niced: the tests leave a
# core idle at times (workers waiting on servers, the last tests), and mypy takes that time instead
# of 40 s of its own before them. Its output follows the tests'; either failing fails the target.
test: test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@nice -n 19 $(BIN)/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	trap 'kill $$mypy 2>/dev/null' INT TERM; \
	echo "$(BIN)/mypy (beside the tests, niced; its output after theirs)"; \
	echo "$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)"; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS); tests=$$?; \
	wait $$mypy; typed=$$?; \
	echo "$(BIN)/mypy:"; cat $(VENV)/mypy.log; \
	[ $$tests = 0 ] && [ $$typed = 0 ]

unit: install
	$(BIN)/pytest -m 'not integration' $(PYTEST_ARGS)

integration: install chromium
	$(BIN)/pytest -m integration $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## demo: bring the local stack up, run the demo, bring it down
demo: install
	$(BIN)/karpflow demo

up: install
	$(BIN)/karpflow dev up

down: install
	$(BIN)/karpflow dev down

status: install
	$(BIN)/karpflow dev status

# Every bench at modest sizes (bench/run_all.py; the big sizes are in each script's docstring).
bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(TOOLS) .state .pytest_cache .ruff_cache .mypy_cache .hypothesis
