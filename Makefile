# Two commands: `make run` (install, then open the chat on the starter model) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint bench install clients fuzz docs

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "localllm needs Python 3.10 or newer"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "Installing localllm (llama-cpp-python compiles from source the first time: about 5 minutes)"
	$(BIN)/python -m pip install --progress-bar on -e '.[dev,mlx]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/localllm

lint: $(STAMP)
	$(BIN)/python .ci/check_structure.py
	$(BIN)/ruff check localllm tests benchmarks .ci
	$(BIN)/ruff format --check localllm
	$(BIN)/mypy
	$(BIN)/lint-imports

# two pytest-xdist workers, a test file each at a time (a file's servers stay with it)
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# the tests about control flow: no model, no process (under a minute here)
test-fast: $(STAMP)
	LOCALLLM_TEST_TIER=fast $(BIN)/python -m pytest -q -m "not model and not process and not mlx"

# the file-system boundary's properties with 10,000 random trees and races per variant
# (openat2 and the walk), random names and launch configs: minutes; the suite runs 60 each
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 3600 \
		-W error::pytest.PytestUnhandledThreadExceptionWarning \
		tests/unit/test_fsguard.py tests/unit/test_agent_boundary.py tests/unit/test_launch.py

# the docs site: the reference pages generated from the code (CLI, settings, HTTP API),
# then MkDocs in strict mode (a broken link or anchor fails) into site/
docs: $(STAMP)
	$(BIN)/python .ci/reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Codex CLI, Claude Code and opencode (from npm) run headless against a real server;
# writes docs/clients.md (minutes per client on a CPU; not part of CI); MODEL=PATH for
# another model than the starter
MODEL ?= starter
clients: $(STAMP)
	$(BIN)/python .ci/clients.py --model $(MODEL)

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_decode
	$(BIN)/python -m benchmarks.bench_tui
	$(BIN)/python -m benchmarks.bench_mlx
	$(BIN)/python -m benchmarks.bench_pull
	$(BIN)/python -m benchmarks.bench_switch
	$(BIN)/python -m benchmarks.bench_quantize
	$(BIN)/python -m benchmarks.bench_speculative
	$(BIN)/python -m benchmarks.bench_concurrency
