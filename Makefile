# Two commands on a fresh machine: `make demo` (set up, then plan the bundled default request with
# every planner) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean profiles

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch this machine carries; on a GPU machine the CUDA build already installed is kept.
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install --quiet 'torch==2.13.0'
	$(BIN)/pip install --quiet -e '.[dev,worker,api,viz,data]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/skrull compare --request examples/requests/default.json

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check skrull solver cli worker api corpus tests bench examples
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/planners.py
	$(BIN)/python bench/latency.py
	$(BIN)/python bench/ilp.py --sizes 16,32,64 --budgets 1
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/execute.py
	$(BIN)/python bench/service.py
	$(BIN)/python bench/store.py

profiles: $(STAMP)
	$(BIN)/skrull derive-profile --all --write-bundled

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
