# Set-up and test entry points. pip + venv on purpose: uv ignores the local CPU torch
# wheel and would download a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 1919

.PHONY: serve test test-tools install install-test gpu-wheels clean agents-smoke

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the local CPU build, unless some torch is already importable.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[test]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/edgemoe serve --host $(HOST) --port $(PORT)

# The browser and the terminal the web page and `edgemoe chat` tests drive (Debian's
# packages, installed when missing and we are root). Without them those tests skip,
# except with CI=true, where they fail.
TEST_TOOLS := chromium chromedriver tmux
test-tools:
	@missing=""; for t in $(TEST_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium chromium-driver tmux (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver tmux >/dev/null; \
	  else \
	    echo "missing:$$missing; install chromium chromium-driver tmux, or the web page and chat tests skip"; \
	  fi; \
	fi

# The suite's files dealt over one worker a core, at most 4 (each worker imports torch: ~0.7 GB);
# a file's tests stay in one worker, so its module fixtures are built once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: install-test test-tools
	$(BIN)/python -m pytest tests -m "not gpu" -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile

# Claude Code, Codex and OpenCode from the npm registry (into .agents/), one tool-call
# turn each against `edgemoe serve` with a scripted backend. Not part of `test`.
agents-smoke: install
	$(BIN)/python scripts/agents_smoke.py

clean:
	rm -rf $(VENV) build src/*.egg-info
