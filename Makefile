# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONHASHSEED := 0

.PHONY: demo test test-slow lint format benchmarks clean venv mutation

venv: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardplan demo

# The doctests of the torch-free packages run as a second, separate invocation; modules that
# import torch at the top (shardplan/capture, shardplan/runtime, shardplan/workload) are not
# collected (the measurement ranks, shardplan/measure, import torch inside their functions:
# their doctests run).
DOCTEST_ARGS := --doctest-modules shardplan --ignore=shardplan/capture \
	--ignore=shardplan/runtime --ignore=shardplan/workload

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile
	$(PY) -m pytest -q $(DOCTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Mutation testing (slow, not in CI): MUTANTS="glob ..." restricts it to matching mutants.
mutation: $(STAMP)
	$(PY) benchmarks/mutation_report.py --run $(MUTANTS)

# mypy reads its settings (files, excluded torch packages) from pyproject.toml [tool.mypy].
lint: $(STAMP)
	$(VENV)/bin/ruff check shardplan tests benchmarks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format shardplan tests benchmarks

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache mutants .mypy_cache
