#!/usr/bin/env bash
# The GPU path, one script, under 8 minutes on one GPU: installs the CUDA extras into .venv-gpu,
# runs the CUDA tests and bench/gpu_check.py (trainer tokens/s on CUDA, vLLM CUDA hot reload with
# logprob agreement). Record its last lines in bench/RESULTS.md with the date and the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/python -m pip install -q --upgrade pip
.venv-gpu/bin/python -m pip install -q -e ".[trainer,inference,dev]"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
.venv-gpu/bin/python -m pytest -q -p no:cacheprovider tests/trainer/test_cuda.py
.venv-gpu/bin/python bench/gpu_check.py
