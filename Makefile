# The two commands the README promises: `make demo` (the main job) and `make test`.
# Both set up what a fresh machine lacks: a virtualenv, a Docker engine, the sandbox image
# (and, for the tests, PostgreSQL's server binaries: the catalog's tests start a server).
VENV ?= .venv
BIN := $(VENV)/bin
# The `claude` CLI that spillbox.integrations.claude_agent's tests and example drive, pinned,
# in a folder of the checkout's own (never a global install).
CLAUDE_CODE := @anthropic-ai/claude-code@2.1.332
CLAUDE_DIR := .tools/claude-code

.PHONY: core install docker postgres image demo test lint bench clean

# The demo and the image need spillbox alone; the tests need the dev extra (the frameworks,
# Ray, the linters) and the claude CLI, most of the install's time.
core: $(VENV)/.core

install: $(VENV)/.installed $(CLAUDE_DIR)/.installed

$(VENV)/.core: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

$(CLAUDE_DIR)/.installed: Makefile
	npm install --prefix $(CLAUDE_DIR) --no-save --no-fund --no-audit --loglevel=error $(CLAUDE_CODE)
	$(CLAUDE_DIR)/node_modules/.bin/claude --version
	touch $@

docker:
	scripts/ensure-docker.sh

postgres:
	scripts/ensure-postgres.sh

image: core docker
	$(BIN)/spillbox image build

demo: image
	$(BIN)/spillbox demo

lint: install
	$(BIN)/ruff check runtime sandbox_images tests benchmarks examples
	$(BIN)/ruff format --check runtime sandbox_images tests benchmarks examples
	$(BIN)/mypy

test: lint image postgres
	$(BIN)/pytest -m "not serial"
	$(BIN)/pytest -m serial -n 0

bench: install image
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(CLAUDE_DIR)
