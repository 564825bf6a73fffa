# The two commands: `make demo` (the local multi-region stack) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export RAY_USAGE_STATS_ENABLED=0

.PHONY: install demo test lint protos unit integration bench

install:
	@bash scripts/install.sh $(VENV)

demo: install
	$(VENV)/bin/scheduler up --demo

lint: install
	$(VENV)/bin/ruff check scheduler tests
	$(VENV)/bin/mypy scheduler

test: lint
	$(PY) -m pytest tests

protos: install
	$(PY) scripts/gen_protos.py

bench: install
	$(VENV)/bin/scheduler bench decide
