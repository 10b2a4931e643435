# Two commands on a fresh machine: `make demo` (set up, then plan the bundled default request with
# every planner) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint bench clean profiles gpu-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, as $(TORCH): pip takes the build its index offers (the CPU wheel where pip is configured
	# with one, as on the project's CI machines; plain PyPI on Linux serves the CUDA build). `make TORCH=...`
	# chooses another build; a venv that already has torch keeps it.
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install --quiet '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[dev,worker,api,viz,data,hf]'
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

# GPU acceptance on a machine with CUDA GPUs (docs/finetune.md): flash-attn, the GPU tests, a measured
# profile (kept under docs/gpu-check/ with the device and the date), its predictions checked against
# measured microbatch times (median within 15%), and a measured training step per planner.
GPU_CHECK := docs/gpu-check

gpu-check: $(STAMP)
	@$(BIN)/python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make gpu-check: needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False); nothing was run")'
	$(BIN)/python -c 'import flash_attn' 2>/dev/null || $(BIN)/pip install --no-build-isolation flash-attn
	$(BIN)/python -m pytest -q -m gpu
	mkdir -p $(GPU_CHECK)
	$(BIN)/skrull profile --model qwen2.5-0.5b --gpus $$($(BIN)/python -c 'import torch; print(torch.cuda.device_count())') \
		--output $(GPU_CHECK)/profile.json
	$(BIN)/skrull profile --check $(GPU_CHECK)/profile.json --max-median-error 0.15 > $(GPU_CHECK)/profile-check.md; \
		status=$$?; cat $(GPU_CHECK)/profile-check.md; exit $$status
	$(BIN)/python bench/finetune_step.py --profile $(GPU_CHECK)/profile.json --out docs/finetune-step.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
