#!/usr/bin/env bash
# README command 1: install everything (first run) and run the demo study to results/report.html.
# Extra arguments go to Snakemake, e.g. `bash scripts/demo.sh --configfile my.yaml`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Snakemake reads its config files before the workflow's code runs, so a missing one is a 26-line
# traceback; name it in one line first (relative paths are relative to the repository, as there).
# --configfile(s) takes every word after it up to the next option, and --configfile=FILE one.
check_configfiles() {
    local arg taking=0 file
    for arg in "$@"; do
        file=""
        case "$arg" in
            --configfile=* | --configfiles=*) file="${arg#*=}" taking=0 ;;
            --configfile | --configfiles) taking=1 ;;
            -*) taking=0 ;;
            *) [[ $taking == 1 ]] && file="$arg" ;;
        esac
        if [[ -n "$file" && ! -f "$file" ]]; then
            local why="no such file"
            [[ -e "$file" ]] && why="not a file"
            echo "demo: --configfile $file: $why (relative to $(pwd))" >&2
            return 2
        fi
    done
}
check_configfiles "$@" || exit 2

source scripts/bootstrap.sh
started=$SECONDS
# The console a person can follow (scalestudy.console): one line per finished job, no job headers,
# the scheduler's and the report's chatter left out; warnings and errors as Snakemake prints them.
# Snakemake's whole log: .snakemake/log/; each job's command: the first line of its own log.
snakemake --profile profiles/local "$@" 2>&1 | python -m scalestudy.console condense
snakemake --profile profiles/local "$@" --report results/report.html 2>&1 | python -m scalestudy.console condense
# the report into the study's crate, which rule crate wrote before the report could exist
if [ -d results/crate ]; then
    python -m scalestudy.crate --log-level WARNING add results/crate --zip results/crate.zip results/report.html >/dev/null
fi
python -m scalestudy.console summary --seconds $((SECONDS - started))
