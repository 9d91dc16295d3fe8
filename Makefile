# Two entry points, each doing all of its own set-up in a local virtual environment (.venv):
#   make demo   the main job on built-in defaults
#   make test   the test suite (installs the dev extra: pytest, torch CPU for zoo exports, peer tools)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.stamp-runtime
DEV_STAMP := $(VENV)/.stamp-dev

.PHONY: demo test clean-venv

demo: $(RUNTIME_STAMP)
	$(BIN)/workbench demo

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	# The browser tests drive Debian's Chromium: installed with apt where apt works (as root), in the background while
	# pip installs the package with its dev extra (one resolve: 71 s vs 75 s for two); on failure those tests skip.
	# tensorrt-stubs declares a dependency on full tensorrt, which cannot install here: take the stubs alone.
	( if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi \
	) > $(VENV)/apt-chromium.log 2>&1 & apt=$$!; \
	$(BIN)/python -m pip install -q -e '.[dev]' && touch $(RUNTIME_STAMP) \
		&& $(BIN)/python -m pip install -q --no-deps tensorrt-stubs==10.13.0.35.1; status=$$?; \
	wait $$apt || tail -5 $(VENV)/apt-chromium.log; exit $$status
	touch $@

clean-venv:
	rm -rf $(VENV)
