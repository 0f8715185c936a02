# boundwatch: `make run` sets up and runs the daemon; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
ARGS   ?=

.PHONY: run demo test lint typecheck system-deps grafana-schema bench clean help

help:
	@echo "make run    - set up a virtualenv and run the daemon (http://127.0.0.1:9482/metrics)"
	@echo "make demo   - the same pipeline and /metrics fed by labelled demo GPUs (no GPU or engine needed)"
	@echo "make test   - set up test dependencies (Python, promtool, prometheus) and run the tests"
	@echo "make lint   - ruff"
	@echo "make typecheck - mypy"

# Running needs only the package's own dependencies; the test and lint toolchain comes with `make test`.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(TEST_STAMP)

run: $(STAMP)
	@echo "boundwatch: serving this host's real readings; no GPU or engine here? 'make demo' shows labelled demo data"
	$(VENV)/bin/boundwatch $(ARGS)

demo: $(STAMP)
	$(VENV)/bin/boundwatch demo $(ARGS)

# Debian's prometheus (promtool, a real server) and alertmanager, for rule tests and scrape tests; chromium
# (headless) for the status page's browser test.
SYSTEM_PACKAGES := prometheus prometheus-alertmanager chromium fonts-dejavu-core
system-deps:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	  elif command -v sudo >/dev/null 2>&1; then \
	    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	  else echo "warning: promtool/prometheus/amtool/chromium missing and no root: their tests will be skipped"; fi; \
	fi

# Grafana's published dashboard schema and tsc, for tests/test_dashboard_schema.py (skipped without npm).
GRAFANA_SCHEMA := .cache/grafana-schema
grafana-schema:
	@if [ ! -x $(GRAFANA_SCHEMA)/node_modules/.bin/tsc ]; then \
	  if command -v npm >/dev/null 2>&1; then \
	    mkdir -p $(GRAFANA_SCHEMA) && npm install --silent --no-audit --no-fund --prefix $(GRAFANA_SCHEMA) @grafana/schema@11.6.16 typescript@5.9 >/dev/null \
	      || echo "warning: npm could not install @grafana/schema: the dashboard schema test will be skipped"; \
	  else echo "warning: npm missing: the dashboard schema test will be skipped"; fi; \
	fi

test: $(TEST_STAMP) system-deps grafana-schema
	$(PY) -m pytest -q $(ARGS)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check exporter tests bench
	$(VENV)/bin/ruff format --check exporter tests bench

typecheck: $(TEST_STAMP)
	$(VENV)/bin/mypy exporter

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
