# ladder: the commands a newcomer needs. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: help setup run test lint typecheck check bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installed once, again only when pyproject.toml changes.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,hf]'
	@touch $@

setup: $(VENV)/.installed  ## create .venv and install ladder with its dev tools and the hf extra (CPU torch when no torch is there)

run: setup  ## train the default experiment on this machine
	$(BIN)/python train.py

check: setup  ## lint, format check, type check and the import layers (make test runs them too)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# First the CPU's MFU peaks, on quiet cores (tests/calibrate_cpu_peaks.py); then two pytest runs
# side by side, and the checks beside them: every tier but slurm and multinode
# on every core (pytest-xdist), a module to a worker (its module fixtures train once), while the
# slurm and multinode tiers, which mostly wait on their clusters' schedulers, run in a pytest of
# their own. A run's ranks leave a core idle while its launcher plans and while they import,
# which the other worker's run fills. The checks' and the cluster tiers' output follows the
# tests'; each pytest prints its time per tier, and the end sums them up with one line of
# outcomes (tests/tier_clock.py). The exit status is the first failure's of all of them.
TIER_TIMES := .pytest_cache/tier_times.jsonl
CLUSTER_LOG := .pytest_cache/cluster_tiers.log
CHECK_LOG := .pytest_cache/check.log
TIMED := LADDER_TIER_TIMES=$(TIER_TIMES) $(BIN)/python -m pytest

test: setup  ## lint, type-check, check the import layers, then every test tier this machine can run, with the time per tier
	@mkdir -p .pytest_cache && rm -f $(TIER_TIMES) $(CLUSTER_LOG) $(CHECK_LOG)
	@$(BIN)/python tests/calibrate_cpu_peaks.py
	@status=0; 	$(MAKE) --no-print-directory check > $(CHECK_LOG) 2>&1 & checks=$$!; 	$(TIMED) -m "slurm or multinode" -p no:cacheprovider > $(CLUSTER_LOG) 2>&1 & cluster=$$!; 	$(TIMED) -m "not slurm and not multinode" -n auto --dist loadfile || status=$$?; 	wait $$cluster || status=$$?; 	echo "== the slurm and multinode tiers, run beside the tiers above:"; cat $(CLUSTER_LOG); 	wait $$checks || status=$$?; 	echo "== ruff, mypy and lint-imports, run beside the tests:"; cat $(CHECK_LOG); 	$(BIN)/python tests/tier_clock.py $(TIER_TIMES); 	exit $$status

bench: setup  ## the quick benchmarks (each prints its figure on the last line)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/plan_speed.py

clean:  ## remove run outputs (not .venv)
	rm -rf outputs multirun
