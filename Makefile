# hsextract: the two commands of the README, and what they need.
#   make extract   run the whole extraction on the embedded defaults (tiny model, bundled dataset)
#   make test      run the whole test suite (lint, unit, real SGLang on CPU, real systemd sandbox)
# Virtual environments are built from pinned locks and cached by the locks' hash, so a second
# run (and CI on the same machine) reuses them.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CACHE ?= /var/cache/hsextract
PYENV_ROOT ?= $(HOME)/.pyenv
# The ml-env needs Python 3.11 (the CPU torch wheels on these machines are cp311); ansible-core 2.21 needs >= 3.12.
PY311 ?= $(firstword $(shell for p in python3.11 $(PYENV_ROOT)/versions/3.11*/bin/python3.11 python3; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 11)' >/dev/null 2>&1 && { command -v $$p || echo $$p; } && break; done))
PY312 ?= $(firstword $(shell for p in python3.12 python3.13 $(PYENV_ROOT)/versions/3.12*/bin/python3.12 $(PYENV_ROOT)/versions/3.13*/bin/python3.13; do \
	$$p -c 'import sys; assert sys.version_info[:2] >= (3, 12)' >/dev/null 2>&1 && { command -v $$p || echo $$p; } && break; done))

ML_HASH := $(shell sha256sum requirements/ml-env.lock | cut -c1-16)
READERS_HASH := $(shell sha256sum requirements/readers.txt | cut -c1-16)
CTRL_HASH := $(shell sha256sum requirements/controller.txt 2>/dev/null | cut -c1-16)
TOOLS_HASH := $(shell sha256sum requirements/test-tools.txt | cut -c1-16)
VENV ?= $(CACHE)/venv-$(ML_HASH)
CONTROLLER ?= $(CACHE)/controller-$(CTRL_HASH)
READERS ?= $(CACHE)/readers-$(READERS_HASH)
TEST_TOOLS ?= $(CACHE)/test-tools-$(TOOLS_HASH)

export HSEXTRACT_VENV := $(VENV)
export HSEXTRACT_PYTHON := $(VENV)/bin/python
export HSEXTRACT_READERS := $(READERS)
export HSEXTRACT_ANSIBLE_BIN := $(CONTROLLER)/bin
export PYTHONPATH := $(CURDIR)/files/python:$(CURDIR)/tests
export PIP_DISABLE_PIP_VERSION_CHECK := 1

PYTEST_ARGS ?=
# pytest processes of `make test` (pytest-xdist), each taking whole modules (`--dist loadfile`): a
# module keeps its sandbox, its servers and its ordered steps on one process; the modules that use
# the session's shared servers run on one process together (tests/conftest.py). 0: one process.
# Two on a 2-core machine: one process leaves the cores 30 % idle while sandboxes' plays wait.
TEST_WORKERS ?= 2
# What pytest runs: the whole suite, or e.g. TESTS=tests/drain for one area.
TESTS ?= tests

.PHONY: help venv controller test test-fast lint extract bench clean-venvs

help:
	@echo "make extract   run the extraction end to end on the embedded defaults"
	@echo "make test      run the whole test suite"
	@echo "make test-fast | lint | venv | controller | bench"

# The ml-env: SGLang 0.5.23, torch and the test tools.
# The path carries the lock's hash, so the stamp alone says whether this exact env is built
# (a fresh clone's newer file times must not trigger a rebuild).
$(VENV)/.complete:
	@test -n "$(PY311)" || { echo "Python 3.11 not found; set PY311=/path/to/python3.11" >&2; exit 1; }
	@echo "Building the ml-env at $(VENV) (SGLang and CUDA torch: about 11 GB, 5-12 minutes the first time)."
	rm -rf $(VENV)
	$(PY311) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements/ml-env.lock
	touch $@

# The trainers' own readers, each in its own --target dir (they conflict as one install).
$(READERS)/.complete: | $(VENV)/.complete
	rm -rf $(READERS)
	grep -v '^\s*#' requirements/readers.txt | grep ':' | while IFS=: read -r name specs; do \
		$(VENV)/bin/pip install -q --no-deps --no-compile --target $(READERS)/$$name $$specs; done
	touch $@

# The test runner's tools (pytest-xdist), beside the ml-env so that adding one does not rebuild it.
$(TEST_TOOLS)/.complete: | $(VENV)/.complete
	rm -rf $(TEST_TOOLS)
	$(VENV)/bin/pip install -q --no-deps --no-compile --target $(TEST_TOOLS) -r requirements/test-tools.txt
	touch $@

venv: $(VENV)/.complete $(READERS)/.complete $(TEST_TOOLS)/.complete
	@echo $(VENV)

$(CONTROLLER)/.complete:
	@test -n "$(PY312)" || { echo "Python >= 3.12 not found (ansible-core 2.21 needs it); set PY312=..." >&2; exit 1; }
	rm -rf $(CONTROLLER)
	$(PY312) -m venv $(CONTROLLER)
	$(CONTROLLER)/bin/pip install -q -r requirements/controller.txt
	touch $@

controller: $(CONTROLLER)/.complete
	@echo $(CONTROLLER)

# Every linter of the suite (ruff, mypy, yamllint, the playbooks' syntax checks, ansible-lint,
# shellcheck): the suite's tests marked `lint`, without the rest, so each linter is written once.
lint: venv controller
	$(VENV)/bin/python -m pytest -m lint tests -q -p no:cacheprovider

test: venv controller
	PYTHONPATH=$(PYTHONPATH):$(TEST_TOOLS) $(VENV)/bin/python -m pytest $(TESTS) \
		-p xdist -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit and pure tests, an answer within minutes while working: no SGLang server, no systemd
# sandbox, no linter, no test that starts processes (tests/conftest.py SLOW_MODULES). A test that
# starts a server or a sandbox without its marker fails here.
test-fast: venv controller
	HSEXTRACT_FAST_TIER=1 $(VENV)/bin/python -m pytest $(TESTS) -m "not server and not sandbox and not lint and not slow" \
		-q -p no:cacheprovider $(PYTEST_ARGS)

extract: venv controller
	bash scripts/extract-local.sh

bench: venv
	$(VENV)/bin/python bench/drain_throughput.py
	$(VENV)/bin/python bench/extract_e2e.py

clean-venvs:
	rm -rf $(CACHE)/venv-* $(CACHE)/controller-* $(CACHE)/readers-* $(CACHE)/test-tools-*
