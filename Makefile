# Two commands on a fresh machine: `make demo` (install + whole pipeline) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.ai4dl-installed
CONF   ?= conf/local.yaml

# Debian packages: the demo needs a Java runtime for Spark (skipped when a `java` is already on the PATH); the
# tests add a JDK (`ai4dl sql` compiles its read-only guard with javac), chromium (the report opened in a real
# browser) and prometheus (a real server for the Prometheus ingest test, with promtool). One package per line, so
# branches adding packages merge cleanly; installed only when missing and when we may (root with apt-get);
# otherwise the demo says what is missing and those tests skip.
DEMO_PACKAGES = \
	openjdk-17-jre-headless
TEST_PACKAGES = \
	openjdk-17-jdk-headless \
	chromium \
	prometheus

.PHONY: install demo-deps _demo-packages system-deps demo test reference bench clean

define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "not installed:$$missing (needs root and apt-get)"; fi
endef

# The venv is made once; torch (large) is downloaded only when pyproject.toml changes or the venv is new.
# -W hides setuptools' note on editable installs (a warning block on every install, nothing to act on).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -W "ignore:Editable installation" -m pip install -q -e '.[spark,dev]'
	touch $(STAMP)

demo-deps:
	@if command -v java >/dev/null 2>&1; then :; else $(MAKE) --no-print-directory _demo-packages; fi

_demo-packages:
	$(call apt_install,$(DEMO_PACKAGES))

# The test-only packages (the demo does not need them).
system-deps:
	$(call apt_install,$(TEST_PACKAGES))

# Java, the venv, Delta's JARs fetched and the JVM class archive written once, so the first command starts as
# fast as later ones.
install: demo-deps $(STAMP)
	$(BIN)/python -c "from ai4dl.lake.session import prepare_local_start; prepare_local_start()"

demo: install
	$(BIN)/ai4dl demo --conf $(CONF)

# The default suite on both cores (pytest-xdist; a test file stays on one worker, so its module fixtures are
# built once), then the slow complete checks one at a time (they start processes, clusters and kill them).
# `pytest` alone runs the default suite; `pytest -m slow` the slow one.
test: install system-deps
	$(BIN)/python -m pytest -n 2 --dist loadfile
	$(BIN)/python -m pytest -m slow

# The DLaaS sample labelled with the original AI4DL model (needs ../shared beside the project).
reference: install
	$(BIN)/ai4dl import-reference-model ../shared/data/reference/reference_model.json --conf conf/dlaas_reference.yaml
	$(BIN)/ai4dl ingest --conf conf/dlaas_reference.yaml
	$(BIN)/ai4dl window --conf conf/dlaas_reference.yaml
	$(BIN)/ai4dl label --conf conf/dlaas_reference.yaml
	$(BIN)/ai4dl behaviour --conf conf/dlaas_reference.yaml
	$(BIN)/ai4dl policies --conf conf/dlaas_reference.yaml --set policies.interval_steps=5
	$(BIN)/ai4dl report --conf conf/dlaas_reference.yaml

bench: install
	$(BIN)/python bench/pipeline.py

clean:
	rm -rf data spark-warehouse .pytest_cache
