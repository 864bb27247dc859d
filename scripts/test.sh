#!/usr/bin/env bash
# README command 2 (and CI's): install everything (first run), lint, and run the whole test suite.
# The Slurm tests bring up a throw-away Slurm cluster on this machine (root and apt needed; they
# skip with the reason otherwise). Extra arguments go to pytest, e.g. `-m "not slurm"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ruff check .
ruff format --check .
snakemake --lint --profile profiles/local
python -m pytest -ra "$@"
