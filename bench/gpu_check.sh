#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, run the GPU handler test, the end-to-end correctness tests (TorchServe
# gives each worker a GPU: gpu_id) and the default bench; where there is none, say so and skip.
# GPU_PYTHON: a Python with a CUDA build of torch==2.13.0 and this repo installed (pip install -r requirements.txt
# from the default index, then pip install -e .); default .venv/bin/python, whose torch is the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_PYTHON:-.venv/bin/python}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: skipped: no NVIDIA GPU here (nvidia-smi finds none)"
  exit 0
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: skipped: $PY has no CUDA torch (torch.cuda.is_available() is False); set GPU_PYTHON" >&2
  exit 0
fi
nvidia-smi -L
"$PY" -m pytest -q tests/handler/test_engines.py -k cuda
"$PY" -m pytest -q tests/e2e/test_serving.py tests/e2e/test_openai.py
"$PY" bench/compare.py --suite default --no-progress
