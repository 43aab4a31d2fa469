# Everything runs in .venv at the repo root. torch is pinned first so pip takes the
# local CPU wheel and never pulls a multi-GB CUDA build.
PY := .venv/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: setup serve test lint bench

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: .venv/.installed

serve: setup
	.venv/bin/specserve serve

test: setup
	$(PY) -m ruff check .
	OMP_NUM_THREADS=2 $(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check .
