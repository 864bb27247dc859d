#!/usr/bin/env bash
# README command 1: install everything (first run) and run the demo study to results/report.html.
# Extra arguments go to Snakemake, e.g. `bash scripts/demo.sh --configfile my.yaml`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
snakemake --profile profiles/local "$@"
snakemake --profile profiles/local "$@" --report results/report.html
echo "demo: report at $(pwd)/results/report.html"
