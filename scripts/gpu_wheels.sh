#!/usr/bin/env bash
# Fetch, here, the wheels the GPU machine lacks for benchmarks/krea2_steps.py: diffusers (the version installed
# here, so what the tests ran against travels) and importlib_metadata, which diffusers needs and that machine's image
# does not hold. Everything else diffusers needs (huggingface-hub, safetensors, numpy, Pillow, regex, requests,
# filelock) is in that image. Both wheels are pure Python.
#
#   bash scripts/gpu_wheels.sh           # writes .whl/ (ignored by git), about 5 MB
#
# Then carry ".whl" in the device run; scripts/gpu_check.sh installs whatever .whl/ holds into a scratch folder
# on its PYTHONPATH before its steps.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$(command -v python || command -v python3)}"
if ! VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("diffusers"))' 2>/dev/null)"; then
    echo "diffusers is not installed for $PY: run this in the project's environment (pip install -e '.[test]')," >&2
    echo "or name its python in PYTHON=" >&2
    exit 2
fi
rm -rf "$REPO/.whl"
# The GPU machine runs CPython 3.12 on x86-64 (see the device notes); pure-Python wheels fit any of those.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$REPO/.whl" "diffusers==$VERSION" importlib_metadata
ls -l "$REPO/.whl"
