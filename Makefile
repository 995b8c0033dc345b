# disagg-operator developer loop. `make test` and `make demo` work on a fresh machine:
# they create .venv, install Debian packages and build the Kubernetes binaries as needed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DISAGG_CACHE ?= $(HOME)/.cache/disagg
export DISAGG_CACHE
LINT_DIRS := $(wildcard operator engine tests e2e bench manifests upstream images)

.PHONY: help venv test test-fast test-e2e lint facts facts-check crds manifests lock images demo demo-down binaries system-packages clean

help:
	@echo "make test   - lint, fast tests and e2e tests against the local control plane"
	@echo "make demo   - the whole system end to end on this machine"
	@echo "make lint   - ruff, mypy --strict, import-linter"
	@echo "make crds   - regenerate crds/ (and the chart's copy) from the pydantic models"
	@echo "make manifests - regenerate manifests/install.yaml, the Argo CD health patch, the chart schema and README"
	@echo "make facts  - regenerate upstream/facts.json from the pinned vLLM and SGLang releases"

# The dev venv takes the images' exact versions (both locks: the router's adds the tokenizer),
# so the tests run what the images ship; `make lock` writes the locks back after an upgrade.
$(STAMP): pyproject.toml engine/pyproject.toml images/operator.lock images/router.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c images/operator.lock -c images/router.lock -e ./engine -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

system-packages:
	@bash e2e/cluster/install-system-packages.sh

binaries:
	@bash e2e/cluster/build-binaries.sh

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy
	# The bench scripts import the e2e harness by path, as they run.
	MYPYPATH=e2e:bench $(BIN)/mypy --strict bench/*.py
	$(BIN)/lint-imports

# The pinned engines' flags, config keys, metrics and TP rules, read with ast from their
# releases on PyPI (cached in $(DISAGG_CACHE)/upstream); tests/test_upstream_facts.py checks
# the project against them, and facts-check fails when the committed file is stale.
facts: $(STAMP)
	$(BIN)/python upstream/facts.py

facts-check: $(STAMP)
	$(BIN)/python upstream/facts.py --check

crds: $(STAMP)
	$(BIN)/disagg crds --output-dir crds --reference docs/reference.md
	cp crds/disaggregatedmodels.disagg.dev.yaml charts/disagg-operator/files/

images: $(STAMP) system-packages
	bash images/build.sh operator router engine-standin

lock: $(STAMP)
	$(BIN)/python images/lock.py

manifests: $(STAMP) binaries
	$(BIN)/python manifests/generate.py $(DISAGG_CACHE)/bin/helm/helm

test-fast: $(STAMP)
	$(BIN)/pytest tests -q

test-e2e: $(STAMP) system-packages binaries
	$(BIN)/pytest e2e -q

test: lint facts-check test-fast test-e2e

demo: $(STAMP) system-packages binaries
	$(BIN)/disagg demo $(DEMO_ARGS)

demo-down: $(STAMP)
	$(BIN)/disagg demo down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
