#!/usr/bin/env bash
# Set up a virtual environment in .venv with ditgate installed (editable).
#   bash scripts/setup.sh        -> runtime only
#   bash scripts/setup.sh test   -> runtime + test extras (pytest, triton for TRITON_INTERPRET, matplotlib)
# torch is pinned to the 2.13.0 build (on CPU machines here it is the CPU wheel); on a GPU machine,
# install the CUDA torch of your choice first and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q "torch==2.13.0"
fi
if [ "${1:-}" = "test" ]; then
    .venv/bin/pip install -q -e ".[test]"
else
    .venv/bin/pip install -q -e ".[plot]"
fi
