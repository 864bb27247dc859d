#!/usr/bin/env bash
# README command 1: install everything (first run) and run the demo study to results/report.html.
# Extra arguments go to Snakemake, e.g. `bash scripts/demo.sh --configfile my.yaml`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
snakemake --profile profiles/local "$@"
snakemake --profile profiles/local "$@" --report results/report.html
# the report into the study's crate, which rule crate wrote before the report could exist
if [ -d results/crate ]; then
    python -m scalestudy.crate add results/crate --zip results/crate.zip results/report.html
fi
echo "demo: report at $(pwd)/results/report.html"
