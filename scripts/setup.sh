#!/usr/bin/env bash
# Set up .venv with the project and its dev tools. Installs the CPU build of torch unless a torch
# is already importable or TORCH_SPEC says otherwise (e.g. TORCH_SPEC="torch" for the CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
source .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  # A plain `pip install torch` pulls the multi-GB CUDA build: pin the CPU wheel first.
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
python -m pip install -q -e ".[dev]"
