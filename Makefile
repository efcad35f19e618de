# The two commands of the README: `make up` and `make test`. Each does its own set-up.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# Two xdist workers: every test that needs a core to itself — Chromium, netns hosts, worker
# kills and gap or loss bounds, floods, benches, latency, load — runs in one of them, one at
# a time; the other takes the unit tests and the functional tests that start appliances or
# SIP peers (tests/conftest.py, SERIAL_DIRS, SHARED_FILES). The appliances under test count
# only their own CPU as load (`--headroom own`, tests/conftest.py), so the other worker's
# busy core does not read as lost headroom. 921 s -> 487 s of pytest on the 2-core box
# (issue 33); grown to 1149 s of serial lane by issue 41, split again to ~810 s against
# ~740 s. `PYTEST_ARGS=` runs one process.
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: up test test-stress flakes lint typecheck unit sysdeps realtime-client venv install install-test bench fuzz screenshots clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Runtime install (make up), with the speech extra so `--agent assistant` works.
$(VENV)/.installed: pyproject.toml setup.py appliance/netio/_mmsg.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[speech]'
	touch $@

# Runtime + test extras (make test). They include the runtime install, so both stamps are
# touched: `make up` after `make test` does not install again.
# openai-agents (the RealtimeRunner test, tests/realtime/test_websocket.py) goes into its own
# directory, put on PYTHONPATH by that test's subprocess only: its top-level package is named
# `agents`, which would shadow the suite's tests/agents/ in the venv.
$(VENV)/.installed-test: pyproject.toml setup.py appliance/netio/_mmsg.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --upgrade --target $(VENV)/openai-agents 'openai-agents>=0.4,<1'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# System packages the tests drive for real: Debian's Chromium, redis-server, iproute2, nftables
# (the ICE-TCP test blocks UDP in a namespace with it), openssl, coturn (its turnutils_uclient
# and turnutils_peer test our TURN server; its own turnserver service is disabled at once, or
# it would take UDP/TCP 3478, the appliance's default media port),
# and node + npm (they bundle the official @openai/agents-realtime for the browser tests).
# Installed only when one is missing, so a warm machine pays nothing; a Chromium older than
# CHROMIUM_MIN (the oldest major the suite is known to work with, tests/peers.py) is
# upgraded. Between CHROMIUM_MIN and the newest tested major the suite accepts each version's
# getStats() spellings; set APPLIANCE_CHROMIUM=/path/to/chromium to test another binary.
CHROMIUM_MIN := 150

sysdeps:
	@missing=""; \
	if command -v chromium >/dev/null; then \
	  major=$$(chromium --version 2>/dev/null | sed -n 's/^Chromium \([0-9][0-9]*\)\..*/\1/p'); \
	  if [ -n "$$major" ] && [ "$$major" -lt $(CHROMIUM_MIN) ]; then \
	    echo "chromium $$major is older than $(CHROMIUM_MIN), the oldest the suite is known to work with"; \
	    missing="$$missing chromium"; \
	  fi; \
	else missing="$$missing chromium"; fi; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v nft >/dev/null || [ -x /usr/sbin/nft ] || missing="$$missing nftables"; \
	command -v sipp >/dev/null || missing="$$missing sip-tester"; \
	command -v baresip >/dev/null || missing="$$missing baresip"; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v turnutils_uclient >/dev/null || missing="$$missing coturn"; \
	command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing="$$missing haproxy"; \
	[ -e /usr/lib/$$(uname -m)-linux-gnu/libspeexdsp.so.1 ] || ldconfig -p 2>/dev/null | grep -q libspeexdsp.so.1 || missing="$$missing libspeexdsp1"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	  for svc in coturn haproxy; do case " $$missing " in *" $$svc "*) \
	    $$SUDO systemctl disable --now $$svc >/dev/null 2>&1 || true;; esac; done; \
	fi

up: install
	$(BIN)/appliance up

lint: install-test
	$(BIN)/ruff check appliance tests bench examples fuzz

typecheck: install-test
	$(BIN)/mypy

unit: install-test sysdeps realtime-client
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The official @openai/agents-realtime from npm, bundled into one file for the browser tests
# (npm ci + esbuild; node_modules/ and the bundle are cached, so a rerun does nothing).
realtime-client: sysdeps
	sh tests/browser/realtime_client/build.sh

test: lint typecheck unit

# Issue 33: the whole suite with a CPU hog busy on one of the cores for the whole run; and
# the flake hunt: the timing-sensitive tests FLAKE_RUNS times each under the hog, with a
# table of every test that failed at least once (.ci/flakes.py), with `make test`'s two
# workers (a round of FLAKE_TESTS: ~5.5 min under the hog on the 2-core box).
FLAKE_RUNS ?= 20
FLAKE_TESTS ?= tests/browser tests/e2e tests/reliability tests/transceiver tests/interop

test-stress: install-test
	$(BIN)/python .ci/hog.py -- $(MAKE) test

flakes: install-test sysdeps realtime-client
	$(BIN)/python .ci/hog.py -- $(BIN)/python .ci/flakes.py --runs $(FLAKE_RUNS) $(PYTEST_ARGS) $(FLAKE_TESTS)

# Coverage-guided fuzzing (atheris) of every network parser, FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 60

$(VENV)/.installed-fuzz: $(VENV)/.installed-test
	$(BIN)/pip install -q atheris || echo "atheris did not install: fuzz/run.py uses --engine random"
	touch $@

# Then the same targets under hypothesis, random and 10x the examples (HYPOTHESIS_PROFILE=deep):
# make test's profile is derandomized (tests/conftest.py), so new findings come from here.
fuzz: $(VENV)/.installed-fuzz
	$(BIN)/python fuzz/run.py --seconds $(FUZZ_SECONDS)
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests/fuzz

# The README's pictures, from a real `appliance up` driven by Chromium (commit the PNGs).
screenshots: install-test sysdeps
	$(BIN)/python tests/browser/readme_screenshots.py

bench: install-test
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
