# The two commands: `make demo` (the local multi-region stack) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export RAY_USAGE_STATS_ENABLED=0

.PHONY: install demo test lint protos infra simulate bench fuzz

install:
	@bash scripts/install.sh $(VENV)

demo: install
	$(VENV)/bin/scheduler up --demo

lint: install
	$(VENV)/bin/ruff check scheduler tests infra
	$(VENV)/bin/mypy scheduler
	$(VENV)/bin/mypy --explicit-package-bases infra/render.py

# pytest's exit code 5 (no tests collected) is a failure like any other.
test: lint
	@$(PY) -m pytest tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing"; fi; exit $$rc

# 10,000 Hypothesis-drawn requests against one live router (make test runs 1,000 of them).
fuzz: install
	FUZZ_EXAMPLES=10000 $(PY) -m pytest tests/fuzz -p no:cacheprovider

protos: install
	$(PY) scripts/gen_protos.py

# Re-render the Kubernetes manifests after editing regions/ or policies/ (a test checks they match).
infra: install
	$(PY) infra/render.py

simulate: install
	$(VENV)/bin/scheduler simulate --compare default,latency-first,carbon-first --trace conv --hours 24

bench: install
	$(VENV)/bin/scheduler bench decide
	$(VENV)/bin/scheduler bench router
	$(VENV)/bin/scheduler bench simulate
