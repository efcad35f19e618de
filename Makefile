# The two commands of the README: `make up` and `make test`. Each does its own set-up.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: up test lint typecheck unit sysdeps venv install install-test bench fuzz clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Runtime install (make up).
$(VENV)/.installed: pyproject.toml setup.py appliance/netio/_mmsg.c | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Runtime + test extras (make test).
$(VENV)/.installed-test: pyproject.toml setup.py appliance/netio/_mmsg.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# System packages the tests drive for real: Debian's Chromium, redis-server, iproute2, openssl.
# Installed only when one is missing, so a warm machine pays nothing.
sysdeps:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

up: install
	$(BIN)/appliance up

lint: install-test
	$(BIN)/ruff check appliance tests bench examples fuzz

typecheck: install-test
	$(BIN)/mypy

unit: install-test sysdeps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck unit

# Coverage-guided fuzzing (atheris) of every network parser, FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 60

$(VENV)/.installed-fuzz: $(VENV)/.installed-test
	$(BIN)/pip install -q atheris || echo "atheris did not install: fuzz/run.py uses --engine random"
	touch $@

fuzz: $(VENV)/.installed-fuzz
	$(BIN)/python fuzz/run.py --seconds $(FUZZ_SECONDS)

bench: install-test
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
