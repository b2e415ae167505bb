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

setup: $(VENV)/.installed  ## create .venv and install ladder with its dev tools (CPU torch when no torch is there)

run: setup  ## train the default experiment on this machine
	$(BIN)/python train.py

test: setup  ## lint, type-check, check the import layers, then every test tier this machine can run
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

bench: setup  ## the quick benchmarks (each prints its figure on the last line)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/plan_speed.py

clean:  ## remove run outputs (not .venv)
	rm -rf outputs multirun
