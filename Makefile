# Two commands on a fresh machine: `make demo` (set up, then plan the bundled default request with
# every planner) and `make test`. `make test-fast` is the unit tier, the loop to run while working.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-fast lint bench clean profiles gpu-check image-check conformance

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, as $(TORCH): pip takes the build its index offers (the CPU wheel where pip is configured
	# with one, as on the project's CI machines; plain PyPI on Linux serves the CUDA build). `make TORCH=...`
	# chooses another build; a venv that already has torch keeps it.
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install --quiet '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[dev,worker,api,viz,data,hf,megatron,trl]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/skrull compare --request examples/requests/default.json

# The tiers are markers that tests/conftest.py applies by the rules of tests/tiers.py. `make test` runs
# every test (what CI runs, .ci/run), with the 25 slowest at the end; `make test-fast` leaves out the tests
# that start torchrun, servers or other processes, need PostgreSQL or take seconds each.
FAST := not (torchrun or server or postgres or slow)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "$(FAST)"

# mypy reads imports from folders, not from setuptools' package-dir map: it checks the package through a
# tree of links built here under build/ (never committed), and its messages name the repository's files.
TYPECHECK := build/typecheck
SUBPACKAGES := api cli corpus distributions profiles solver worker

lint: $(STAMP)
	$(BIN)/ruff check skrull solver cli worker api corpus profiles distributions tests bench examples
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/skrull
	for f in __init__.py py.typed; do ln -s ../../../skrull/$$f $(TYPECHECK)/skrull/$$f; done
	for d in $(SUBPACKAGES); do ln -s ../../../$$d $(TYPECHECK)/skrull/$$d; done
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy > $(TYPECHECK)/mypy.log 2>&1; rc=$$?; \
		sed -e 's#$(TYPECHECK)/skrull/\([a-z]*\)/#\1/#' -e 's#$(TYPECHECK)/skrull/__init__#skrull/__init__#' $(TYPECHECK)/mypy.log; \
		exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/planners.py
	$(BIN)/python bench/latency.py
	$(BIN)/python bench/views.py
	$(BIN)/python bench/ilp.py --sizes 16,32,64 --budgets 1
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/equal_microbatches.py
	$(BIN)/python bench/defer.py
	$(BIN)/python bench/never_behind.py
	$(BIN)/python bench/cp_modes.py
	$(BIN)/python bench/budgets.py
	$(BIN)/python bench/auto_scale.py
	$(BIN)/python bench/true_gap.py --quick
	$(BIN)/python bench/execute.py
	$(BIN)/python bench/planner_overhead.py
	$(BIN)/python bench/calibration.py
	$(BIN)/python bench/service.py
	$(BIN)/python bench/store.py

# Every integration (HF Trainer, TRL, own loop with DDP and FSDP2) x layout (DP1xCP4, DP2xCP2, DP4xCP1) x
# architecture (tests/conformance/models) under torchrun with 4 gloo processes: each first step against the
# plain step (<= 1e-4) or refused before it. 72 runs, about a minute each on 2 CPU cores. `make test` runs 4.
conformance: $(STAMP)
	$(BIN)/python tests/conformance/matrix.py --out conformance-matrix.md
	$(BIN)/python tests/conformance/matrix.py --arch qwen2-moe-router-aux --arch mixtral-router-aux \
		--router-aux-loss --out conformance-router-aux.md

profiles: $(STAMP)
	$(BIN)/skrull derive-profile --all --paper-bucket --write-bundled

# GPU acceptance on a machine with CUDA GPUs (docs/gpu-check/README.md): the fast step eager vs compiled
# (tokens/s, MFU), profiles measured on it and checked (median within 15%), whole planned steps' estimates vs
# measured on the bundled mooncake lengths, the HF Trainer under plans vs the plain one; within 7 minutes on
# one H100, written to docs/gpu-check/ with the device, driver and date. Installs nothing (flash-attn 4 is
# used when `flash_attn.cute` imports). Without a CUDA GPU: one line, exit 0, nothing written.
GPU_CHECK := docs/gpu-check

# No setup first: the GPU machine may have no network; the venv's interpreter when there is one, else $(PYTHON)
# with this checkout on PYTHONPATH.
gpu-check:
	@PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
		bash bench/gpu_check.sh $(GPU_CHECK) qwen2.5-0.5b qwen2.5-7b

# The image built and tried where no image registry is reachable (docker/image-check.sh): a bookworm base
# made with debootstrap, `podman build --isolation chroot`, then `skrull serve` in it answering a plan and a
# rank view. Needs root and Debian's podman, buildah and debootstrap.
image-check:
	bash docker/image-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
