#!/usr/bin/env bash
# Builds .gpu-bundle/ HERE, before a GPU machine runs scripts/gpu_check.sh: Snakemake and jsonschema
# for that machine's CPython 3.12, which has torch but no Snakemake and no network. The folder holds
# the dependency closure less what the machine has (scripts/gpu_device_packages.txt): pure-Python
# packages copied from this venv, compiled ones as cp312 manylinux x86_64 wheels from PyPI, unzipped
# (rpds-py, pydantic-core, immutables, greenlet, sqlalchemy); ~43 MB. gpu_check.sh's study step puts
# it on PYTHONPATH. Carry it to the machine with the working tree (it is git-ignored).
#
#   bash scripts/gpu_bundle.sh [OUT_DIR]     # default .gpu-bundle; needs PyPI for the 5 wheels
#
# PYTHON picks the interpreter whose packages are copied (default .venv/bin/python); BUNDLE_PYTHON
# the target's version (default 3.12).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-.gpu-bundle}"
python="${PYTHON:-.venv/bin/python}"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$python" -m scalestudy.benchmark.bundle --out "$out" \
  --wheels-for "${BUNDLE_PYTHON:-3.12}" --present scripts/gpu_device_packages.txt --max-mb 50 \
  snakemake jsonschema
