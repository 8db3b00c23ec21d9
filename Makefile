# Set-up and test entry points. pip + venv on purpose: uv ignores the local CPU torch
# wheel and would download a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 1919

.PHONY: serve test install install-test gpu-wheels clean agents-smoke

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

test: install-test
	$(BIN)/python -m pytest tests -m "not gpu" -p no:cacheprovider

# Claude Code, Codex and OpenCode from the npm registry (into .agents/), one tool-call
# turn each against `edgemoe serve` with a scripted backend. Not part of `test`.
agents-smoke: install
	$(BIN)/python scripts/agents_smoke.py

clean:
	rm -rf $(VENV) build src/*.egg-info
