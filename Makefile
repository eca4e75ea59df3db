# The two commands the README promises: `make demo` (the main job) and `make test`.
# Both set up what a fresh machine lacks: a virtualenv, a Docker engine, the sandbox image
# (and, for the tests, PostgreSQL's server binaries: the catalog's tests start a server).
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install docker postgres image demo test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

docker:
	scripts/ensure-docker.sh

postgres:
	scripts/ensure-postgres.sh

image: install docker
	$(BIN)/spillbox image build

demo: image
	$(BIN)/spillbox demo

lint: install
	$(BIN)/ruff check runtime tests benchmarks examples
	$(BIN)/ruff format --check runtime tests benchmarks examples
	$(BIN)/mypy

test: lint image postgres
	$(BIN)/pytest

bench: image
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV)
